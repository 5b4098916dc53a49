/*
 * test_tp_weights.c - a rank's tensors (lib/tp_weights.c) on a hand-built
 * fp32 Qwen2 layer stack (E=8, 4 query heads of 2, 2 KV heads, FFN 344,
 * vocab 300, 2 layers; every value its own index, so a wrong element is
 * seen), for every rank of degrees 2 and 4:
 *  - column-parallel tensors (q/k/v and their biases, gate, up) and the
 *    head are views of the right rows of the full tensor;
 *  - row-parallel tensors (o_proj, down) are copies whose every element is
 *    the full tensor's element at the rank's column;
 *  - replicated tensors (norms, embedding) are the full views;
 *  - an absent optional bias stays absent with its sliced shape;
 *  - the rank's config carries its head / KV head / FFN counts.
 */
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "testutil.h"
#include "tp_weights.h"

enum { E = 8, H = 4, KV = 2, D = 2, F = 344, V = 300, NL = 2 };

static float *store[64];
static int n_store;

static dsq_tensor mk(int64_t r, int64_t c, float base)
{
    dsq_tensor t;
    memset(&t, 0, sizeof t);
    float *p = malloc((size_t)(r * c) * sizeof *p);
    assert_non_null(p);
    for (int64_t i = 0; i < r * c; i++)
        p[i] = base + (float)i;
    store[n_store++] = p;
    t.data = p;
    t.dtype = DSQ_DT_F32;
    t.ndim = c > 1 ? 2 : 1;
    t.shape[0] = r;
    t.shape[1] = c > 1 ? c : 0;
    t.nbytes = (size_t)(r * c) * 4;
    return t;
}

static void test_slices(void **state)
{
    (void)state;
    dsq_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.arch = &dsq_arch_qwen2;
    cfg.n_embd = E, cfg.n_heads = H, cfg.n_kv_heads = KV, cfg.head_dim = D, cfg.n_ff = F, cfg.n_vocab = V,
    cfg.n_layers = NL;
    dsq_weights w;
    dsq_layer_weights layers[NL];
    memset(&w, 0, sizeof w);
    memset(layers, 0, sizeof layers);
    w.layers = layers;
    w.g[DSQ_GW_TOK_EMBD] = mk(V, E, 0);
    w.g[DSQ_GW_OUT_NORM] = mk(E, 1, 0);
    w.g[DSQ_GW_LM_HEAD] = mk(V, E, 1e5f);
    for (int l = 0; l < NL; l++) {
        dsq_layer_weights *L = &layers[l];
        L->t[DSQ_LW_ATTN_NORM] = mk(E, 1, 0);
        L->t[DSQ_LW_Q] = mk(H * D, E, 1000);
        L->t[DSQ_LW_Q_BIAS] = mk(H * D, 1, 2000);
        L->t[DSQ_LW_K] = mk(KV * D, E, 3000);
        /* k bias absent: shape only */
        L->t[DSQ_LW_K_BIAS].dtype = DSQ_DT_F32;
        L->t[DSQ_LW_K_BIAS].ndim = 1;
        L->t[DSQ_LW_K_BIAS].shape[0] = KV * D;
        L->t[DSQ_LW_V] = mk(KV * D, E, 4000);
        L->t[DSQ_LW_V_BIAS] = mk(KV * D, 1, 5000);
        L->t[DSQ_LW_O] = mk(E, H * D, 6000);
        L->t[DSQ_LW_FFN_NORM] = mk(E, 1, 0);
        L->t[DSQ_LW_GATE] = mk(F, E, 1e4f);
        L->t[DSQ_LW_UP] = mk(F, E, 2e4f);
        L->t[DSQ_LW_DOWN] = mk(E, F, 3e4f);
    }
    for (int32_t world = 2; world <= 4; world += 2)
        for (int32_t r = 0; r < world; r++) {
            dsq_tp_slice s;
            assert_int_equal(dsq_tp_plan(&cfg, r, world, &s), DSQ_OK);
            dsq_tp_weights tw;
            assert_int_equal(dsq_tp_weights_make(&cfg, &w, &s, &tw), DSQ_OK);
            assert_int_equal(tw.cfg.n_heads, s.n_q_heads);
            assert_int_equal(tw.cfg.n_kv_heads, s.n_kv_heads);
            assert_int_equal(tw.cfg.n_ff, s.n_ff);
            assert_int_equal(tw.cfg.n_vocab, V);
            assert_ptr_equal(tw.w.g[DSQ_GW_TOK_EMBD].data, w.g[DSQ_GW_TOK_EMBD].data);
            const dsq_tensor *hd = &tw.w.g[DSQ_GW_LM_HEAD];
            assert_int_equal(hd->shape[0], s.n_vocab);
            assert_ptr_equal(hd->data, (const float *)w.g[DSQ_GW_LM_HEAD].data + (size_t)s.vocab0 * E);
            for (int l = 0; l < NL; l++) {
                const dsq_layer_weights *A = &layers[l], *B = &tw.w.layers[l];
                assert_ptr_equal(B->t[DSQ_LW_ATTN_NORM].data, A->t[DSQ_LW_ATTN_NORM].data);
                const int64_t q0 = (int64_t)s.q_head0 * D, k0 = (int64_t)s.kv_head0 * D;
                assert_int_equal(B->t[DSQ_LW_Q].shape[0], s.n_q_heads * D);
                assert_ptr_equal(B->t[DSQ_LW_Q].data, (const float *)A->t[DSQ_LW_Q].data + q0 * E);
                assert_ptr_equal(B->t[DSQ_LW_Q_BIAS].data, (const float *)A->t[DSQ_LW_Q_BIAS].data + q0);
                assert_ptr_equal(B->t[DSQ_LW_K].data, (const float *)A->t[DSQ_LW_K].data + k0 * E);
                assert_null(B->t[DSQ_LW_K_BIAS].data);
                assert_int_equal(B->t[DSQ_LW_K_BIAS].shape[0], s.n_kv_heads * D);
                assert_ptr_equal(B->t[DSQ_LW_V_BIAS].data, (const float *)A->t[DSQ_LW_V_BIAS].data + k0);
                assert_ptr_equal(B->t[DSQ_LW_GATE].data, (const float *)A->t[DSQ_LW_GATE].data + (size_t)s.ff0 * E);
                assert_int_equal(B->t[DSQ_LW_UP].shape[0], s.n_ff);
                /* row parallel: copies of the rank's columns */
                const dsq_tensor *o = &B->t[DSQ_LW_O], *dn = &B->t[DSQ_LW_DOWN];
                assert_int_equal(o->shape[0], E);
                assert_int_equal(o->shape[1], s.n_q_heads * D);
                assert_int_equal(dn->shape[1], s.n_ff);
                assert_int_equal(dn->nbytes, (size_t)E * s.n_ff * 4);
                for (int64_t i = 0; i < E; i++) {
                    for (int64_t j = 0; j < o->shape[1]; j++)
                        assert_true(((const float *)o->data)[i * o->shape[1] + j] ==
                                    ((const float *)A->t[DSQ_LW_O].data)[i * H * D + q0 + j]);
                    for (int64_t j = 0; j < s.n_ff; j++)
                        assert_true(((const float *)dn->data)[i * s.n_ff + j] ==
                                    ((const float *)A->t[DSQ_LW_DOWN].data)[i * F + s.ff0 + j]);
                }
            }
            dsq_tp_weights_free(&tw);
            dsq_tp_weights_free(&tw); /* freed: a no-op */
        }
    dsq_tp_weights_free(NULL);
    for (int i = 0; i < n_store; i++)
        free(store[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = { cmocka_unit_test(test_slices) };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
