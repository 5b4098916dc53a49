/* test_arch.c - every model description in dsq_archs[] is consistent, the
 * check a new architecture passes before any golden data: the recipe names
 * only roles the tensor table has (weights required, biases optional), the
 * table has no tensor the recipe or the model-wide roles leave unused, names
 * are unique with one %d per per-layer pattern, and shapes fit the ops
 * (norms 1-D [E], matrices [out, in] with the dimensions the op implies). */
#include <stdio.h>
#include <string.h>

#include "testutil.h"

#include "arch.h"
#include "internal.h"

static const dsq_tensor_spec *spec(const dsq_arch *a, int role)
{
    const dsq_tensor_spec *s = dsq_arch_tensor(a, 1, role);
    if (!s)
        fail_msg("%s: the recipe names layer role %d, the tensor table has none", a->name, role);
    return s;
}

static void expect_shape(const dsq_arch *a, int role, dsq_dim rows, dsq_dim cols)
{
    const dsq_tensor_spec *s = spec(a, role);
    if (s->rows != rows || s->cols != cols)
        fail_msg("%s: tensor %s has dims (%d, %d), its op needs (%d, %d)", a->name, s->name, s->rows, s->cols,
                 rows, cols);
}

static void check_arch(const dsq_arch *a)
{
    int used[DSQ_LW_COUNT] = {0};
    assert_true(a->n_ops > 0 && a->n_ops <= DSQ_MAX_OPS);
    int attends = 0, writes_q = 0;
    for (int i = 0; i < a->n_ops; i++) {
        const dsq_op *op = &a->recipe[i];
        for (int j = 0; j < 3; j++) {
            if (op->w[j] >= 0) {
                assert_true(op->w[j] < DSQ_LW_COUNT);
                assert_false(spec(a, op->w[j])->flags & DSQ_TF_OPTIONAL); /* weights are required */
                used[op->w[j]] = 1;
            }
            if (op->b[j] >= 0) {
                assert_true(op->b[j] < DSQ_LW_COUNT);
                spec(a, op->b[j]);
                used[op->b[j]] = 1;
            }
        }
        switch (op->kind) {
        case DSQ_OP_NORM:
            expect_shape(a, op->w[0], DSQ_DIM_EMBD, DSQ_DIM_NONE);
            break;
        case DSQ_OP_QKV_ROPE: {
            const dsq_dim out[3] = {DSQ_DIM_Q, DSQ_DIM_KV, DSQ_DIM_KV};
            for (int j = 0; j < 3; j++) {
                expect_shape(a, op->w[j], out[j], DSQ_DIM_EMBD);
                if (op->b[j] >= 0)
                    expect_shape(a, op->b[j], out[j], DSQ_DIM_NONE);
            }
            writes_q = 1;
            break;
        }
        case DSQ_OP_ATTEND:
            assert_true(writes_q); /* attention reads the q/k/v of this layer */
            attends = 1;
            break;
        case DSQ_OP_LINEAR_RESID:
            expect_shape(a, op->w[0], DSQ_DIM_EMBD, op->in == DSQ_IN_ACT ? DSQ_DIM_FF : DSQ_DIM_Q);
            if (op->in == DSQ_IN_ATT)
                assert_true(attends);
            break;
        case DSQ_OP_GATED_FFN:
            expect_shape(a, op->w[0], DSQ_DIM_FF, DSQ_DIM_EMBD);
            expect_shape(a, op->w[1], DSQ_DIM_FF, DSQ_DIM_EMBD);
            break;
        default:
            fail_msg("%s: op %d has unknown kind %d", a->name, i, (int)op->kind);
        }
    }
    for (int i = 0; i < a->n_tensors; i++) {
        const dsq_tensor_spec *s = &a->tensors[i];
        if (s->per_layer) {
            assert_true(s->role >= 0 && s->role < DSQ_LW_COUNT);
            if (!used[s->role])
                fail_msg("%s: tensor %s is bound but no op uses it", a->name, s->name);
            const char *pc = strstr(s->name, "%d");
            assert_non_null(pc);
            assert_null(strstr(pc + 1, "%"));
        } else {
            assert_true(s->role >= 0 && s->role < DSQ_GW_COUNT);
            assert_null(strchr(s->name, '%'));
        }
        for (int j = 0; j < i; j++)
            if (strcmp(a->tensors[j].name, s->name) == 0 || (a->tensors[j].role == s->role &&
                                                              a->tensors[j].per_layer == s->per_layer))
                fail_msg("%s: tensors %d and %d repeat a name or a role", a->name, j, i);
    }
    for (int r = 0; r < DSQ_GW_COUNT; r++)
        assert_non_null(dsq_arch_tensor(a, 0, r)); /* embedding, final norm, head */
    assert_true(dsq_arch_tensor(a, 0, DSQ_GW_LM_HEAD)->flags & DSQ_TF_HEAD);
    printf("  %s: %d tensors, %d ops per layer: consistent\n", a->name, a->n_tensors, a->n_ops);
}

static void test_descriptions(void **state)
{
    (void)state;
    int n = 0;
    for (; dsq_archs[n]; n++)
        check_arch(dsq_archs[n]);
    assert_true(n >= 1);
}

/* Names come from the table: a layer's name has its index, a model-wide one
 * none, a role without a spec reads as "(unnamed)". */
static void test_names(void **state)
{
    (void)state;
    char buf[160];
    assert_string_equal(dsq_arch_tensor_name(&dsq_arch_qwen2, 1, DSQ_LW_K_BIAS, 17, buf, sizeof buf),
                        "model.layers.17.self_attn.k_proj.bias");
    assert_string_equal(dsq_arch_tensor_name(&dsq_arch_qwen2, 0, DSQ_GW_OUT_NORM, 3, buf, sizeof buf),
                        "model.norm.weight");
    assert_string_equal(dsq_arch_tensor_name(&dsq_arch_qwen2, 1, DSQ_LW_O_BIAS, 0, buf, sizeof buf), "(unnamed)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_descriptions),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
