/*
 * test_cuda_attention.cu - KV write, prefill and decode attention kernels
 * (cuda/attention.h) against a plain double-precision CPU reference.
 *
 * Each scenario draws fresh random Q/K/V (bf16 values), writes the cache with
 * dsq_attn_kv_write (old tokens, then the new ones: prompts may extend a
 * cached prefix), checks the stored cache bit-exactly against the host's own
 * rounding/quantization, runs the kernel on NaN-poisoned outputs and compares
 * with the reference computed on the dequantized cache (what the kernel
 * read) and, for INT8, also reports the error against the unquantized K/V.
 * Unwritten cache rows are NaN, so any read outside the sequences shows up.
 *
 * DSQ_ATTN_QUICK=1 runs only the short cases (for compute-sanitizer).
 * Exits 77 (skip) when no CUDA device is usable.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

extern "C" {
#include "testutil.h"
}
#include "attention.h"
#include "internal.h"

/* max|a-b| / max|ref| against the reference on the dequantized cache.
 * bf16 output rounding alone is 2^-9 relative; measured errors are printed. */
static const double kTol = 8e-3;
/* INT8 against unquantized K/V: a sanity bound, the error is reported. */
static const double kTolUnquant = 0.1;

static int g_quick = 0;

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(e_));                                              \
            fail();                                                                       \
        }                                                                                 \
    } while (0)

/* a launcher of attention.h (dsq_status, message in the last error) */
#define AK(call)                                                                          \
    do {                                                                                  \
        dsq_status s_ = (call);                                                           \
        if (s_ != DSQ_OK) {                                                               \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,            \
                    dsq_status_string(s_), dsq_last_error_message());                     \
            fail();                                                                       \
        }                                                                                 \
    } while (0)

/* ---- random numbers -------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd_u64(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float rnd_uni(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rnd_u64() >> 40) * (1.0 / 16777216.0));
}
static float bf16_round(float x) { return dsq_bf16_to_f32(dsq_f32_to_bf16(x)); }

/* ---- the host mirror of a cache + batch ------------------------------------- */

struct Scenario {
    const char *name;
    int D, H, KVH, dtype, paged, bs;
    std::vector<int> pos0, n; /* per batch sequence: cached tokens, new tokens */
    /* optional: K (side 0) or V (side 1) element 5 of kv head inj_head of
     * sequence inj_seq at position inj_pos is set to inj_val */
    int inj_seq = -1, inj_pos = 0, inj_head = 0, inj_side = 0;
    float inj_val = 0.f;
    int cap = 0; /* static caches: rows per sequence (0: the longest + 3, odd on purpose) */
};

struct Built {
    int n_seqs, W, q_stride, o_stride;
    int n_new, max_n;
    int64_t n_rows;
    std::vector<int> bt;        /* [n_seqs][bt_stride] */
    int bt_stride, block_size;
    std::vector<int> cu;        /* [n_seqs+1] offsets of new tokens */
    std::vector<std::vector<float>> kt, vt; /* true (bf16) K/V [T][KVH][D] */
    std::vector<std::vector<float>> kd, vd; /* as stored, dequantized      */
    std::vector<float> q;       /* new tokens' Q [n_new][H*D] */
    /* device */
    void *dk, *dv;
    float *dks, *dvs;
    int32_t *dbt, *dcu, *dpos0, *dlens;
    uint16_t *dqkv_new;
    dsq_attn_kv kv;
};

static int64_t host_row(const Built &b, int s, int p)
{
    return (int64_t)b.bt[(size_t)s * b.bt_stride + p / b.block_size] * b.block_size +
           p % b.block_size;
}

/* Host twin of the kernel's INT8 quantization (attention.h): a vector with
 * a NaN or Inf is all zeros with a NaN scale. */
static void quant_i8(const float *x, int D, int8_t *q, float *scale)
{
    float amax = 0.f;
    bool finite = true;
    for (int i = 0; i < D; i++) {
        amax = fmaxf(amax, fabsf(x[i]));
        finite = finite && isfinite(x[i]);
    }
    float s = finite ? amax / 127.0f : NAN;
    for (int i = 0; i < D; i++) {
        float r = s > 0.f ? rintf(x[i] / s) : 0.f;
        q[i] = (int8_t)fminf(fmaxf(r, -127.f), 127.f);
    }
    *scale = s;
}

static void fill_token(const Scenario &sc, std::vector<uint16_t> &row, const float *k,
                       const float *v, const float *q)
{
    const int D = sc.D;
    for (int i = 0; i < sc.H * D; i++)
        row[i] = dsq_f32_to_bf16(q ? q[i] : rnd_uni(-3, 3));
    for (int i = 0; i < sc.KVH * D; i++) {
        row[(size_t)sc.H * D + i] = dsq_f32_to_bf16(k[i]);
        row[(size_t)(sc.H + sc.KVH) * D + i] = dsq_f32_to_bf16(v[i]);
    }
}

/* Draw the data, lay out the cache, write it with dsq_attn_kv_write, verify
 * the stored bytes, and read back the dequantized cache. */
static void build(const Scenario &sc, Built &b)
{
    const int D = sc.D, KVH = sc.KVH, H = sc.H;
    b.n_seqs = (int)sc.n.size();
    b.W = (H + 2 * KVH) * D;
    b.q_stride = b.W;
    b.o_stride = H * D + 8;
    std::vector<int> T(b.n_seqs);
    int maxT = 0;
    b.n_new = 0;
    b.max_n = 0;
    b.cu.assign(1, 0);
    for (int s = 0; s < b.n_seqs; s++) {
        T[s] = sc.pos0[s] + sc.n[s];
        maxT = std::max(maxT, T[s]);
        b.n_new += sc.n[s];
        b.max_n = std::max(b.max_n, sc.n[s]);
        b.cu.push_back(b.n_new);
    }
    /* physical layout */
    if (sc.paged) {
        b.block_size = sc.bs;
        b.bt_stride = (maxT + sc.bs - 1) / sc.bs + 1;
        int need = 0;
        for (int s = 0; s < b.n_seqs; s++)
            need += (T[s] + sc.bs - 1) / sc.bs;
        int n_blocks = need + 7;
        std::vector<int> perm(n_blocks);
        for (int i = 0; i < n_blocks; i++)
            perm[i] = i;
        for (int i = n_blocks - 1; i > 0; i--)
            std::swap(perm[i], perm[rnd_u64() % (uint64_t)(i + 1)]);
        b.bt.assign((size_t)b.n_seqs * b.bt_stride, -1);
        int next = 0;
        for (int s = 0; s < b.n_seqs; s++)
            for (int j = 0; j < (T[s] + sc.bs - 1) / sc.bs; j++)
                b.bt[(size_t)s * b.bt_stride + j] = perm[next++];
        b.n_rows = (int64_t)n_blocks * sc.bs;
    } else {
        int max_context = sc.cap > 0 ? sc.cap : maxT + 3; /* odd on purpose */
        int slots = b.n_seqs + 2;
        b.block_size = max_context;
        b.bt_stride = 1;
        b.bt.resize(b.n_seqs);
        for (int s = 0; s < b.n_seqs; s++)
            b.bt[s] = slots - 1 - s; /* slot != batch index */
        b.n_rows = (int64_t)slots * max_context;
    }
    /* data: K/V magnitudes vary per (token, head) so INT8 scales matter; V
     * has a per-(seq, head, dim) offset so outputs are O(1). */
    b.kt.resize(b.n_seqs);
    b.vt.resize(b.n_seqs);
    b.q.resize((size_t)b.n_new * H * D);
    std::vector<uint16_t> old_buf, new_buf, row(b.W);
    std::vector<int32_t> old_seq, old_pos, new_seq, new_pos;
    for (int s = 0; s < b.n_seqs; s++) {
        b.kt[s].resize((size_t)T[s] * KVH * D);
        b.vt[s].resize((size_t)T[s] * KVH * D);
        std::vector<float> voff((size_t)KVH * D);
        for (auto &x : voff)
            x = rnd_uni(-1, 1);
        for (int p = 0; p < T[s]; p++) {
            float *k = &b.kt[s][(size_t)p * KVH * D], *v = &b.vt[s][(size_t)p * KVH * D];
            for (int h = 0; h < KVH; h++) {
                float fk = expf(rnd_uni(-1, 1)), fv = expf(rnd_uni(-1, 1));
                for (int d = 0; d < D; d++) {
                    k[h * D + d] = bf16_round(fk * rnd_uni(-2, 2));
                    v[h * D + d] = bf16_round(fv * rnd_uni(-1, 1) + voff[h * D + d]);
                }
            }
            if (s == sc.inj_seq && p == sc.inj_pos)
                (sc.inj_side ? v : k)[sc.inj_head * D + 5] = sc.inj_val;
            const bool is_new = p >= sc.pos0[s];
            float *q = NULL;
            if (is_new) {
                q = &b.q[(size_t)(b.cu[s] + p - sc.pos0[s]) * H * D];
                for (int i = 0; i < H * D; i++)
                    q[i] = bf16_round(rnd_uni(-2, 2));
            }
            fill_token(sc, row, k, v, q);
            std::vector<uint16_t> &buf = is_new ? new_buf : old_buf;
            buf.insert(buf.end(), row.begin(), row.end());
            (is_new ? new_seq : old_seq).push_back(s);
            (is_new ? new_pos : old_pos).push_back(p);
        }
    }
    /* device cache, poisoned: fp16 0xffff and fp32 0xffffffff are NaN */
    const size_t elt = sc.dtype == DSQ_ATTN_KV_INT8 ? 1 : 2;
    const size_t kv_bytes = (size_t)b.n_rows * KVH * D * elt;
    const size_t sc_bytes = (size_t)b.n_rows * KVH * sizeof(float);
    b.dks = b.dvs = NULL;
    CK(cudaMalloc(&b.dk, kv_bytes));
    CK(cudaMalloc(&b.dv, kv_bytes));
    CK(cudaMemset(b.dk, 0xff, kv_bytes));
    CK(cudaMemset(b.dv, 0xff, kv_bytes));
    if (elt == 1) {
        CK(cudaMalloc(&b.dks, sc_bytes));
        CK(cudaMalloc(&b.dvs, sc_bytes));
        CK(cudaMemset(b.dks, 0xff, sc_bytes));
        CK(cudaMemset(b.dvs, 0xff, sc_bytes));
    }
    CK(cudaMalloc(&b.dbt, b.bt.size() * 4));
    CK(cudaMemcpy(b.dbt, b.bt.data(), b.bt.size() * 4, cudaMemcpyHostToDevice));
    b.kv.k = b.dk;
    b.kv.v = b.dv;
    b.kv.k_scale = b.dks;
    b.kv.v_scale = b.dvs;
    b.kv.block_table = b.dbt;
    b.kv.bt_stride = b.bt_stride;
    b.kv.block_size = b.block_size;
    b.kv.n_kv_heads = KVH;
    b.kv.head_dim = D;
    b.kv.dtype = sc.dtype;

    /* two kv_write calls: the cached prefix, then the new tokens */
    for (int pass = 0; pass < 2; pass++) {
        std::vector<uint16_t> &buf = pass ? new_buf : old_buf;
        std::vector<int32_t> &ts = pass ? new_seq : old_seq, &tp = pass ? new_pos : old_pos;
        int nt = (int)ts.size();
        if (nt == 0)
            continue;
        uint16_t *dbuf;
        int32_t *dts, *dtp;
        CK(cudaMalloc(&dbuf, buf.size() * 2));
        CK(cudaMalloc(&dts, (size_t)nt * 4));
        CK(cudaMalloc(&dtp, (size_t)nt * 4));
        CK(cudaMemcpy(dbuf, buf.data(), buf.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dts, ts.data(), (size_t)nt * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dtp, tp.data(), (size_t)nt * 4, cudaMemcpyHostToDevice));
        AK(dsq_attn_kv_write(&b.kv, dbuf + (size_t)H * D, b.W, dbuf + (size_t)(H + KVH) * D, b.W,
                             dts, dtp, nt, 0));
        CK(cudaDeviceSynchronize());
        CK(cudaFree(dts));
        CK(cudaFree(dtp));
        if (pass)
            b.dqkv_new = dbuf; /* Q of the new tokens lives here */
        else
            CK(cudaFree(dbuf));
    }

    /* read back, verify against the host rounding, keep the dequantized cache */
    std::vector<uint8_t> hk(kv_bytes), hv(kv_bytes);
    std::vector<float> hks, hvs;
    CK(cudaMemcpy(hk.data(), b.dk, kv_bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hv.data(), b.dv, kv_bytes, cudaMemcpyDeviceToHost));
    if (elt == 1) {
        hks.resize((size_t)b.n_rows * KVH);
        hvs.resize((size_t)b.n_rows * KVH);
        CK(cudaMemcpy(hks.data(), b.dks, sc_bytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hvs.data(), b.dvs, sc_bytes, cudaMemcpyDeviceToHost));
    }
    b.kd.resize(b.n_seqs);
    b.vd.resize(b.n_seqs);
    int64_t mismatches = 0;
    std::vector<int8_t> qq(D);
    for (int s = 0; s < b.n_seqs; s++) {
        b.kd[s].resize(b.kt[s].size());
        b.vd[s].resize(b.vt[s].size());
        for (int p = 0; p < T[s]; p++) {
            int64_t r = host_row(b, s, p);
            for (int h = 0; h < KVH; h++) {
                size_t src = (size_t)(p * KVH + h) * D;
                size_t dst = (size_t)(r * KVH + h) * D;
                for (int side = 0; side < 2; side++) {
                    const float *x = (side ? b.vt[s].data() : b.kt[s].data()) + src;
                    float *out = (side ? b.vd[s].data() : b.kd[s].data()) + src;
                    const uint8_t *dev = (side ? hv.data() : hk.data());
                    if (elt == 2) {
                        const uint16_t *d16 = (const uint16_t *)dev + dst;
                        for (int i = 0; i < D; i++) {
                            /* IEEE rounding, as the CPU; any NaN is a NaN */
                            uint16_t want = dsq_f32_to_f16(x[i]);
                            out[i] = dsq_f16_to_f32(d16[i]);
                            mismatches += d16[i] != want && !(isnan(x[i]) && isnan(out[i]));
                        }
                    } else {
                        float want_s;
                        quant_i8(x, D, qq.data(), &want_s);
                        float got_s = (side ? hvs : hks)[(size_t)r * KVH + h];
                        mismatches += memcmp(&got_s, &want_s, 4) != 0 &&
                                      !(isnan(got_s) && isnan(want_s));
                        const int8_t *d8 = (const int8_t *)dev + dst;
                        for (int i = 0; i < D; i++) {
                            mismatches += d8[i] != qq[i];
                            out[i] = (float)d8[i] * got_s;
                        }
                    }
                }
            }
        }
    }
    if (mismatches)
        fprintf(stderr, "  kv_write: %lld stored values differ from the host rounding\n",
                (long long)mismatches);
    assert_int_equal(mismatches, 0);

    std::vector<int32_t> lens(b.n_seqs);
    for (int s = 0; s < b.n_seqs; s++)
        lens[s] = T[s];
    CK(cudaMalloc(&b.dcu, b.cu.size() * 4));
    CK(cudaMalloc(&b.dpos0, (size_t)b.n_seqs * 4));
    CK(cudaMalloc(&b.dlens, (size_t)b.n_seqs * 4));
    CK(cudaMemcpy(b.dcu, b.cu.data(), b.cu.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.dpos0, sc.pos0.data(), (size_t)b.n_seqs * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.dlens, lens.data(), (size_t)b.n_seqs * 4, cudaMemcpyHostToDevice));
}

static void release(Built &b)
{
    cudaFree(b.dk);
    cudaFree(b.dv);
    cudaFree(b.dks);
    cudaFree(b.dvs);
    cudaFree(b.dbt);
    cudaFree(b.dcu);
    cudaFree(b.dpos0);
    cudaFree(b.dlens);
    cudaFree(b.dqkv_new);
}

/* softmax(q.K^T / sqrt(D)) V over keys 0..n_keys-1 of kv head kvh, double */
static void ref_attend(const float *q, const float *K, const float *V, int kvh, int KVH, int D,
                       int n_keys, double *out)
{
    std::vector<double> sc(n_keys);
    double mx = -INFINITY, inv_sqrt = 1.0 / sqrt((double)D);
    for (int j = 0; j < n_keys; j++) {
        const float *k = K + ((size_t)j * KVH + kvh) * D;
        double acc = 0;
        for (int d = 0; d < D; d++)
            acc += (double)q[d] * k[d];
        sc[j] = acc * inv_sqrt;
        mx = std::max(mx, sc[j]);
    }
    double sum = 0;
    for (int j = 0; j < n_keys; j++)
        sum += (sc[j] = exp(sc[j] - mx));
    for (int d = 0; d < D; d++)
        out[d] = 0;
    for (int j = 0; j < n_keys; j++) {
        const float *v = V + ((size_t)j * KVH + kvh) * D;
        double w = sc[j] / sum;
        for (int d = 0; d < D; d++)
            out[d] += w * v[d];
    }
}

struct Err {
    double max_abs = 0, max_ref = 0, max_abs_true = 0, max_ref_true = 0;
    long nan = 0;
    void add(double got, double ref, double ref_true)
    {
        if (!(got == got)) {
            nan++;
            return;
        }
        max_abs = std::max(max_abs, fabs(got - ref));
        max_ref = std::max(max_ref, fabs(ref));
        max_abs_true = std::max(max_abs_true, fabs(got - ref_true));
        max_ref_true = std::max(max_ref_true, fabs(ref_true));
    }
    double rel() const { return nan ? INFINITY : max_abs / max_ref; }
    double rel_true() const { return nan ? INFINITY : max_abs_true / max_ref_true; }
};

/* Compare output rows of batch sequence s (new tokens; decode: one) */
static Err check_seq(const Scenario &sc, const Built &b, const std::vector<uint16_t> &out, int s,
                     bool decode)
{
    const int D = sc.D, H = sc.H, KVH = sc.KVH, G = H / KVH;
    const int n = sc.n[s], pos0 = sc.pos0[s];
    Err e;
    /* every output value of the sequence must be finite */
    for (int i = 0; i < n; i++) {
        int orow = decode ? s : b.cu[s] + i;
        for (int c = 0; c < H * D; c++) {
            float x = dsq_bf16_to_f32(out[(size_t)orow * b.o_stride + c]);
            if (!(x == x) || isinf(x))
                e.nan++;
        }
    }
    std::vector<int> rows;
    if (n <= 160) {
        for (int i = 0; i < n; i++)
            rows.push_back(i);
    } else {
        for (int i = 0; i < 8; i++)
            rows.push_back(i);
        for (int i = n - 24; i < n; i++)
            rows.push_back(i);
        for (int i = 0; i < 32; i++)
            rows.push_back(8 + (int)(rnd_u64() % (uint64_t)(n - 32)));
    }
    std::vector<double> r1(D), r2(D);
    for (int i : rows) {
        const int orow = decode ? s : b.cu[s] + i;
        const float *q = &b.q[(size_t)(b.cu[s] + i) * H * D];
        for (int h = 0; h < H; h++) {
            ref_attend(q + h * D, b.kd[s].data(), b.vd[s].data(), h / G, KVH, D, pos0 + i + 1,
                       r1.data());
            if (sc.dtype == DSQ_ATTN_KV_INT8)
                ref_attend(q + h * D, b.kt[s].data(), b.vt[s].data(), h / G, KVH, D,
                           pos0 + i + 1, r2.data());
            else
                r2 = r1;
            for (int d = 0; d < D; d++)
                e.add(dsq_bf16_to_f32(out[(size_t)orow * b.o_stride + h * D + d]), r1[d], r2[d]);
        }
    }
    return e;
}

static double g_worst_f16 = 0, g_worst_i8 = 0, g_worst_i8_true = 0;

static void report(const Scenario &sc, const char *what, int s, const Err &e)
{
    printf("  %-22s %-8s seq %2d pos0 %5d n %5d: max_abs %.3e  rel %.3e", sc.name, what, s,
           sc.pos0[s], sc.n[s], e.max_abs, e.rel());
    if (sc.dtype == DSQ_ATTN_KV_INT8)
        printf("  rel_vs_unquant %.3e", e.rel_true());
    if (e.nan)
        printf("  NON-FINITE %ld", e.nan);
    printf("\n");
    if (sc.dtype == DSQ_ATTN_KV_INT8) {
        g_worst_i8 = std::max(g_worst_i8, e.rel());
        g_worst_i8_true = std::max(g_worst_i8_true, e.rel_true());
    } else {
        g_worst_f16 = std::max(g_worst_f16, e.rel());
    }
}

/* The prefill kernels: 1 the wgmma one where the device and build have it
 * (forced for both cache types: DSQ_CUDA_PREFILL_WGMMA=1), 0 the mma.sync
 * one (=0); -1 the launcher's own choice.  g_pre_kernels: how many of them
 * this device runs (2 on an sm_90a build on sm_90, else 1). */
static int g_pre_kernels = 1;
static void set_prefill_kernel(int wgmma)
{
    if (wgmma < 0)
        unsetenv("DSQ_CUDA_PREFILL_WGMMA");
    else
        setenv("DSQ_CUDA_PREFILL_WGMMA", wgmma ? "1" : "0", 1);
}
static const char *prefill_kernel_name(int32_t kv_dtype)
{
    const int w = dsq_attn_prefill_kernel_wgmma(kv_dtype);
    return w == 1 ? "wgmma" : w == 0 ? "mma" : "error";
}

/* Prefill three ways, each against the CPU reference: one block per query
 * tile (dsq_attn_prefill), split over keys every few tiles (forced: 1 tile
 * for short sequences, else ~4 splits), and the launcher's own plan; each
 * with every prefill kernel the device runs; the outputs and the split
 * workspace are poisoned first. */
static void run_prefill(const Scenario &sc)
{
    Built b;
    memset(&b.kv, 0, sizeof b.kv);
    build(sc, b);
    int max_kv = 0;
    for (int s = 0; s < b.n_seqs; s++)
        max_kv = std::max(max_kv, sc.pos0[s] + sc.n[s]);
    const int kv_tiles = (max_kv + 63) / 64;
    const int forced = kv_tiles <= 8 ? 1 : (kv_tiles + 3) / 4;
    const int n_split = (kv_tiles + forced - 1) / forced;
    const size_t ws_bytes =
        std::max(dsq_attn_prefill_workspace_bytes(b.n_seqs * b.max_n, sc.H, sc.D, std::max(n_split, 8)), (size_t)16);
    void *dout, *ws;
    size_t out_bytes = (size_t)b.n_new * b.o_stride * 2;
    CK(cudaMalloc(&dout, out_bytes));
    CK(cudaMalloc(&ws, ws_bytes));
    bool ok = true;
    for (int run = 0; run < 3 * g_pre_kernels; run++) {
        const int mode = run % 3;
        set_prefill_kernel(run < 3 && g_pre_kernels == 2);
        const char *kname = prefill_kernel_name(sc.dtype);
        CK(cudaMemset(dout, 0xff, out_bytes)); /* bf16 NaN */
        CK(cudaMemset(ws, 0xff, ws_bytes));
        if (mode == 0)
            AK(dsq_attn_prefill(&b.kv, b.dqkv_new, b.q_stride, dout, b.o_stride, b.dcu, b.dpos0, b.n_seqs, b.max_n,
                                sc.H, 0));
        else
            AK(dsq_attn_prefill_ws(&b.kv, b.dqkv_new, b.q_stride, dout, b.o_stride, b.dcu, b.dpos0, b.n_seqs,
                                   b.max_n, max_kv, sc.H, mode == 1 ? forced : 0, ws, ws_bytes, 0));
        CK(cudaDeviceSynchronize());
        std::vector<uint16_t> out((size_t)b.n_new * b.o_stride);
        CK(cudaMemcpy(out.data(), dout, out_bytes, cudaMemcpyDeviceToHost));
        char what[40];
        if (mode == 1)
            snprintf(what, sizeof what, "pre/k%d/%s", forced, kname);
        else
            snprintf(what, sizeof what, mode == 0 ? "prefill/%s" : "pre/auto/%s", kname);
        set_prefill_kernel(-1);
        for (int s = 0; s < b.n_seqs; s++) {
            Err e = check_seq(sc, b, out, s, false);
            report(sc, what, s, e);
            ok = ok && e.rel() < kTol &&
                 (sc.dtype != DSQ_ATTN_KV_INT8 || e.rel_true() < kTolUnquant);
        }
    }
    cudaFree(dout);
    cudaFree(ws);
    release(b);
    assert_true(ok);
}

/* Environment variable `name` set to v (NULL: unset) for the object's
 * lifetime, the caller's value back at the end: a comparison of two paths
 * stays one whatever the environment. */
struct ScopedEnv {
    std::string name, old;
    bool had;
    ScopedEnv(const char *n, const char *v) : name(n)
    {
        const char *e = getenv(n);
        had = e != NULL;
        if (had)
            old = e;
        if (v)
            setenv(n, v, 1);
        else
            unsetenv(n);
    }
    ~ScopedEnv()
    {
        if (had)
            setenv(name.c_str(), old.c_str(), 1);
        else
            unsetenv(name.c_str());
    }
};

/* DSQ_CUDA_DECODE_DIRECT: "1" (one-split launches write their output in
 * the decode kernel, the default) or "0" (the merge kernel) */
struct DirectEnv : ScopedEnv {
    explicit DirectEnv(const char *v) : ScopedEnv("DSQ_CUDA_DECODE_DIRECT", v) {}
};

/* bf16 outputs of two runs that differ, NaN equal to NaN (rows of H*D
 * values at `stride`) */
static size_t bf16_diff(const std::vector<uint16_t> &x, const std::vector<uint16_t> &y, int rows, int n,
                        int64_t stride)
{
    size_t nd = 0;
    for (int s = 0; s < rows; s++)
        for (int i = 0; i < n; i++) {
            const uint16_t a = x[(size_t)s * stride + i], b = y[(size_t)s * stride + i];
            const bool na = (a & 0x7fff) > 0x7f80, nb = (b & 0x7fff) > 0x7f80;
            nd += na != nb || (!na && a != b);
        }
    return nd;
}

/* The decode ring's loader for the object's lifetime (dsq_attn_decode_loader:
 * DSQ_ATTN_LOADER_CP_ASYNC, _BULK or _LEAN), whatever the environment: a
 * reference stays on cp.async. */
struct LoaderEnv {
    ScopedEnv bulk, lean;
    explicit LoaderEnv(int ld)
        : bulk("DSQ_CUDA_DECODE_BULK", ld == DSQ_ATTN_LOADER_BULK ? "1" : "0"),
          lean("DSQ_CUDA_DECODE_LEAN", ld == DSQ_ATTN_LOADER_LEAN ? "1" : "0")
    {
    }
};

/* What the reports call loader ld, and its instance's mangled-name tail. */
static const char *loader_name(int ld)
{
    return ld == DSQ_ATTN_LOADER_BULK ? "bulk-copy" : ld == DSQ_ATTN_LOADER_LEAN ? "lean cp.async" : "cp.async";
}
static const char *loader_word(int ld)
{
    return ld == DSQ_ATTN_LOADER_BULK ? "bulk" : ld == DSQ_ATTN_LOADER_LEAN ? "lean" : "cp.async";
}

/* Loader ld (the bulk copies, DSQ_CUDA_DECODE_BULK=1, or the lean cp.async,
 * DSQ_CUDA_DECODE_LEAN=1) of a launch of `splits` against `ref`, the
 * cp.async loader's output of the same launch: the same bytes in the same
 * stage places and the same arithmetic, so the same bits.  Run twice on
 * poisoned outputs and a stale workspace, three times back to back on one
 * stream (PDL lets each launch start while the one before drains: a bulk
 * block's barriers are its own), then captured in a graph and replayed
 * three times.  Devices without the bulk path (below sm_90) are reported
 * and not counted. */
static size_t g_alt_checked[3], g_alt_unavailable[3];

/* Whether `graph` holds a decode_kernel node and every such node is the
 * instance of loader `ld` (its last template argument, LD: the mangled
 * name ends "...Li<ld>EEEv" before the parameters). */
static bool graph_decode_loader_is(cudaGraph_t graph, int ld)
{
    char tail[16];
    snprintf(tail, sizeof tail, "Li%dEEEv", ld);
    size_t n = 0;
    CK(cudaGraphGetNodes(graph, NULL, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    CK(cudaGraphGetNodes(graph, nodes.data(), &n));
    int found = 0, right = 0;
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType ty;
        CK(cudaGraphNodeGetType(nodes[i], &ty));
        if (ty != cudaGraphNodeTypeKernel)
            continue;
        cudaKernelNodeParams kp;
        CK(cudaGraphKernelNodeGetParams(nodes[i], &kp));
        const char *fname = NULL;
        if (cudaFuncGetName(&fname, kp.func) != cudaSuccess || !fname || !strstr(fname, "decode_kernel"))
            continue;
        found++;
        right += strstr(fname, tail) != NULL;
    }
    return found > 0 && right == found;
}

static bool loader_same(int ld, const char *name, const char *what, int splits, const std::vector<uint16_t> &ref,
                        int n_seqs, int n, int64_t o_stride, void *dout, size_t out_bytes, void *ws, size_t ws_bytes,
                        const std::function<dsq_status(cudaStream_t)> &launch)
{
    const LoaderEnv loader(ld);
    if (dsq_attn_decode_loader() != ld) {
        /* only the bulk copies depend on the device; the lean loader not
         * being chosen is a dispatch bug */
        if (ld != DSQ_ATTN_LOADER_BULK) {
            printf("  %-22s %s/s%-3d %s loader NOT chosen by DSQ_CUDA_DECODE_LEAN=1\n", name, what, splits,
                   loader_name(ld));
            return false;
        }
        if (g_alt_unavailable[ld]++ == 0)
            printf("  %s decode loader: not available on this device (sm_90 code needed), not checked\n",
                   loader_name(ld));
        return true;
    }
    size_t ndiff = 0;
    bool path_ok = false;
    for (int rep = 0; rep < 2; rep++) {
        CK(cudaMemset(dout, 0xff, out_bytes));
        CK(cudaMemset(ws, 0xff, ws_bytes));
        AK(launch(0));
        CK(cudaDeviceSynchronize());
        std::vector<uint16_t> got(ref.size());
        CK(cudaMemcpy(got.data(), dout, out_bytes, cudaMemcpyDeviceToHost));
        ndiff += bf16_diff(ref, got, n_seqs, n, o_stride);
    }
    {
        cudaStream_t st;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        for (int pass = 0; pass < 2; pass++) {
            CK(cudaMemsetAsync(dout, 0xff, out_bytes, st));
            if (pass == 0) {
                for (int rep = 0; rep < 3; rep++)
                    AK(launch(st));
            } else {
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                const dsq_status le = launch(st);
                CK(cudaStreamEndCapture(st, &graph));
                AK(le);
                /* the captured launch is loader ld's instance (the bits
                 * alone cannot tell: every loader gives the same) */
                path_ok = graph_decode_loader_is(graph, ld);
                CK(cudaGraphInstantiate(&exec, graph, 0));
                for (int rep = 0; rep < 3; rep++)
                    CK(cudaGraphLaunch(exec, st));
            }
            CK(cudaStreamSynchronize(st));
            std::vector<uint16_t> got(ref.size());
            CK(cudaMemcpy(got.data(), dout, out_bytes, cudaMemcpyDeviceToHost));
            ndiff += bf16_diff(ref, got, n_seqs, n, o_stride);
        }
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaStreamDestroy(st);
    }
    printf("  %-22s %s/s%-3d %s loader vs cp.async (2 runs, 3 back to back, 3 graph replays): "
           "%zu bf16 values differ; %s instance %s\n", name, what, splits, loader_name(ld), ndiff, loader_word(ld),
           path_ok ? "launched" : "NOT launched (wrong instance)");
    const bool ok = ndiff == 0 && path_ok;
    g_alt_checked[ld] += ok;
    return ok;
}

/* loader_same for every loader but the reference's */
static bool loaders_same(const char *name, const char *what, int splits, const std::vector<uint16_t> &ref, int n_seqs,
                         int n, int64_t o_stride, void *dout, size_t out_bytes, void *ws, size_t ws_bytes,
                         const std::function<dsq_status(cudaStream_t)> &launch)
{
    bool ok = true;
    for (int ld : {DSQ_ATTN_LOADER_BULK, DSQ_ATTN_LOADER_LEAN})
        ok = loader_same(ld, name, what, splits, ref, n_seqs, n, o_stride, dout, out_bytes, ws, ws_bytes, launch) &&
             ok;
    return ok;
}

static void run_decode(const Scenario &sc, const std::vector<int> &split_list)
{
    const DirectEnv merge_path("0");
    const LoaderEnv cp_async_ref(DSQ_ATTN_LOADER_CP_ASYNC); /* loader_same sets its own */
    Built b;
    memset(&b.kv, 0, sizeof b.kv);
    build(sc, b);
    void *dout, *ws;
    size_t out_bytes = (size_t)b.n_seqs * b.o_stride * 2;
    int max_sp = *std::max_element(split_list.begin(), split_list.end());
    size_t ws_bytes = dsq_attn_decode_workspace_bytes(b.n_seqs, sc.H, sc.D, max_sp);
    CK(cudaMalloc(&dout, out_bytes));
    CK(cudaMalloc(&ws, ws_bytes));
    bool ok = true;
    std::vector<uint16_t> first;
    for (int splits : split_list) {
        CK(cudaMemset(dout, 0xff, out_bytes));
        CK(cudaMemset(ws, 0xff, ws_bytes)); /* stale workspace must not matter */
        AK(dsq_attn_decode(&b.kv, b.dqkv_new, b.q_stride, dout, b.o_stride, b.dlens, b.n_seqs,
                           sc.H, splits, ws, ws_bytes, 0));
        CK(cudaDeviceSynchronize());
        std::vector<uint16_t> out((size_t)b.n_seqs * b.o_stride);
        CK(cudaMemcpy(out.data(), dout, out_bytes, cudaMemcpyDeviceToHost));
        char what[32];
        snprintf(what, sizeof what, "dec/s%d", splits);
        for (int s = 0; s < b.n_seqs; s++) {
            Err e = check_seq(sc, b, out, s, true);
            report(sc, what, s, e);
            ok = ok && e.rel() < kTol &&
                 (sc.dtype != DSQ_ATTN_KV_INT8 || e.rel_true() < kTolUnquant);
        }
        if (first.empty())
            first = out;
        ok = loaders_same(sc.name, "dec", splits, out, b.n_seqs, sc.H * sc.D, b.o_stride, dout, out_bytes, ws,
                          ws_bytes, [&](cudaStream_t st) {
                           return dsq_attn_decode(&b.kv, b.dqkv_new, b.q_stride, dout, b.o_stride, b.dlens,
                                                  b.n_seqs, sc.H, splits, ws, ws_bytes, st);
                       }) && ok;
        if (splits == 1) {
            /* one split written out by the decode kernel itself
             * (the default since stop 40; written at stop 39) must give the merge
             * kernel's bits, NaN for NaN */
            CK(cudaMemset(dout, 0xff, out_bytes));
            CK(cudaMemset(ws, 0xff, ws_bytes));
            {
                const DirectEnv direct_path("1");
                AK(dsq_attn_decode(&b.kv, b.dqkv_new, b.q_stride, dout, b.o_stride, b.dlens, b.n_seqs, sc.H, 1,
                                   ws, ws_bytes, 0));
            }
            CK(cudaDeviceSynchronize());
            std::vector<uint16_t> direct((size_t)b.n_seqs * b.o_stride);
            CK(cudaMemcpy(direct.data(), dout, out_bytes, cudaMemcpyDeviceToHost));
            const size_t ndiff = bf16_diff(out, direct, b.n_seqs, sc.H * sc.D, b.o_stride);
            printf("  %-22s one split, direct output vs the merge kernel: %zu bf16 values differ\n", sc.name,
                   ndiff);
            ok = ok && ndiff == 0;
        }
    }
    /* the same launch captured in a CUDA graph and replayed gives the same bits */
    cudaStream_t st;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaMemset(dout, 0xff, out_bytes));
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    dsq_status le = dsq_attn_decode(&b.kv, b.dqkv_new, b.q_stride, dout, b.o_stride, b.dlens,
                                    b.n_seqs, sc.H, split_list[0], ws, ws_bytes, st);
    CK(cudaStreamEndCapture(st, &graph));
    AK(le);
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphLaunch(exec, st));
    CK(cudaStreamSynchronize(st));
    std::vector<uint16_t> replay((size_t)b.n_seqs * b.o_stride);
    CK(cudaMemcpy(replay.data(), dout, out_bytes, cudaMemcpyDeviceToHost));
    bool same = true;
    for (int s = 0; s < b.n_seqs; s++)
        same = same && !memcmp(&replay[(size_t)s * b.o_stride], &first[(size_t)s * b.o_stride],
                               (size_t)sc.H * sc.D * 2);
    printf("  %-22s graph replay of the decode launch: %s\n", sc.name,
           same ? "identical" : "DIFFERENT");
    ok = ok && same;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
    cudaFree(dout);
    cudaFree(ws);
    release(b);
    assert_true(ok);
}

/* ---- scenarios ------------------------------------------------------------ */

static int n_sms(void)
{
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v;
}

static Scenario mk(const char *name, int dtype, int paged, std::vector<int> pos0,
                   std::vector<int> n, int D = 128, int H = 12, int KVH = 2, int bs = 16)
{
    Scenario s;
    s.name = name;
    s.D = D;
    s.H = H;
    s.KVH = KVH;
    s.dtype = dtype;
    s.paged = paged;
    s.bs = bs;
    s.pos0 = pos0;
    s.n = n;
    return s;
}

static const char *nm(int dtype, int paged)
{
    static const char *names[4] = {"f16/static", "f16/paged16", "int8/static", "int8/paged16"};
    return names[(dtype == DSQ_ATTN_KV_INT8) * 2 + paged];
}

static void test_prefill_short(void **state)
{
    (void)state;
    for (int dt = 0; dt < 2; dt++)
        for (int pg = 0; pg < 2; pg++) {
            if (g_quick && dt != pg) /* quick: f16/static and int8/paged */
                continue;
            /* fresh prompts, one varlen batch */
            run_prefill(mk(nm(dt, pg), dt, pg, {0, 0, 0, 0, 0, 0, 0, 0, 0},
                           {1, 2, 15, 16, 17, 63, 64, 65, 127}));
            /* prompts extending cached sequences */
            run_prefill(mk(nm(dt, pg), dt, pg, {1, 5, 16, 64, 100, 37},
                           {1, 16, 17, 64, 127, 2}));
        }
}

static void test_prefill_long(void **state)
{
    (void)state;
    if (g_quick)
        skip();
    for (int dt = 0; dt < 2; dt++)
        for (int pg = 0; pg < 2; pg++) {
            run_prefill(mk(nm(dt, pg), dt, pg, {0, 999, 1000}, {1000, 65, 1000}));
            run_prefill(mk(nm(dt, pg), dt, pg, {0, 4000}, {4097, 4192}));
        }
}

static void test_decode_batch(void **state)
{
    (void)state;
    const int sm = n_sms();
    for (int dt = 0; dt < 2; dt++)
        for (int pg = 0; pg < 2; pg++) {
            if (g_quick && dt != pg)
                continue;
            /* batch of 8 short sequences of different lengths, one launch */
            std::vector<int> L = {1, 2, 15, 16, 17, 63, 64, 65};
            std::vector<int> pos0, one(L.size(), 1);
            for (int x : L)
                pos0.push_back(x - 1);
            int sug = dsq_attn_decode_splits(8, 2, 65, sm, dt);
            run_decode(mk(nm(dt, pg), dt, pg, pos0, one), {sug, 1, 3});
            if (g_quick)
                continue;
            std::vector<int> L2 = {127, 1000, 4097, 8192, 3, 500, 2048, 7777};
            pos0.clear();
            for (int x : L2)
                pos0.push_back(x - 1);
            sug = dsq_attn_decode_splits(8, 2, 8192, sm, dt);
            run_decode(mk(nm(dt, pg), dt, pg, pos0, one), {sug, 1, 7, 32, 33});
        }
}

/* head_dim 64, groups of 4 and of 18 (more query heads per kv head than one
 * mma tile), paged blocks of 32 */
static void test_other_shapes(void **state)
{
    (void)state;
    for (int dt = 0; dt < 2; dt++) {
        run_prefill(mk(dt ? "int8/D64/g4/paged32" : "f16/D64/g4/paged32", dt, 1, {0, 33, 0},
                       {77, 40, 130}, 64, 8, 2, 32));
        run_decode(mk(dt ? "int8/D64/g18/static" : "f16/D64/g18/static", dt, 0, {0, 99, 300},
                      {1, 1, 1}, 64, 36, 2),
                   {1, 4});
        run_decode(mk(dt ? "int8/D128/g18/paged16" : "f16/D128/g18/paged16", dt, 1,
                      {5, 700}, {1, 1}, 128, 18, 1),
                   {2});
        /* the loaders' other cases (every loader checked against cp.async
         * in run_decode): paged blocks of 64 and 128 (a tile is one run of
         * a block: the lean loader's fast path with a real block table),
         * paged decode at D = 64, and a static capacity of 32 rows (a
         * power of two below the tile: every tile crosses it) */
        run_decode(mk(dt ? "int8/D128/paged64" : "f16/D128/paged64", dt, 1, {5, 700, 130, 63},
                      {1, 1, 1, 1}, 128, 12, 2, 64),
                   {1, 3});
        run_decode(mk(dt ? "int8/D128/paged128" : "f16/D128/paged128", dt, 1, {300, 64}, {1, 1}, 128, 12, 2, 128),
                   {1, 2});
        run_decode(mk(dt ? "int8/D64/g4/paged32" : "f16/D64/g4/paged32", dt, 1, {0, 99, 300}, {1, 1, 1}, 64, 8, 2,
                      32),
                   {1, 4});
        Scenario cap32 = mk(dt ? "int8/D128/static32" : "f16/D128/static32", dt, 0, {0, 16, 31}, {1, 1, 1});
        cap32.cap = 32;
        run_decode(cap32, {1});
    }
}

/* ---- decode with RoPE and the KV write inside (dsq_attn_decode_rope) --------
 * The fused kernel against the two-kernel path it replaces
 * (dsq_attn_rope_kv_write, then dsq_attn_decode, whose output run_decode
 * checks against the CPU reference) on the same cache and the same fp32
 * q|k|v rows: the output and every byte of the two caches (so also nothing
 * written outside the new rows) must be identical.  The new rows are
 * poisoned in both caches first; the outputs must be finite, so a row that
 * neither path wrote cannot pass as equal. */
static bool run_decode_rope(const Scenario &sc, int splits)
{
    const DirectEnv merge_path("0");
    const LoaderEnv cp_async_ref(DSQ_ATTN_LOADER_CP_ASYNC); /* loader_same sets its own */
    Built b;
    memset(&b.kv, 0, sizeof b.kv);
    build(sc, b);
    const int D = sc.D, H = sc.H, KVH = sc.KVH, S = b.n_seqs;
    const int rs = b.W + 8; /* fp32 row stride; bf16 rows of path A use it too */
    std::vector<float> x((size_t)S * rs), fq(D / 2);
    for (auto &v : x)
        v = rnd_uni(-3, 3);
    for (int i = 0; i < D / 2; i++)
        fq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)D);
    std::vector<int32_t> pos(S), tseq(S);
    for (int s = 0; s < S; s++) {
        pos[s] = sc.pos0[s]; /* n = 1: the new token is at len - 1 */
        tseq[s] = s;
    }
    const size_t elt = sc.dtype == DSQ_ATTN_KV_INT8 ? 1 : 2;
    const size_t kv_bytes = (size_t)b.n_rows * KVH * D * elt, sc_bytes = (size_t)b.n_rows * KVH * 4;
    /* cache B: a copy of A */
    void *k2, *v2, *ks2 = NULL, *vs2 = NULL;
    CK(cudaMalloc(&k2, kv_bytes));
    CK(cudaMalloc(&v2, kv_bytes));
    CK(cudaMemcpy(k2, b.dk, kv_bytes, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(v2, b.dv, kv_bytes, cudaMemcpyDeviceToDevice));
    if (elt == 1) {
        CK(cudaMalloc(&ks2, sc_bytes));
        CK(cudaMalloc(&vs2, sc_bytes));
        CK(cudaMemcpy(ks2, b.dks, sc_bytes, cudaMemcpyDeviceToDevice));
        CK(cudaMemcpy(vs2, b.dvs, sc_bytes, cudaMemcpyDeviceToDevice));
    }
    void *bufs[2][4] = {{b.dk, b.dv, b.dks, b.dvs}, {k2, v2, ks2, vs2}};
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < S; s++) {
            const int64_t r = host_row(b, s, pos[s]);
            CK(cudaMemset((char *)bufs[c][0] + r * KVH * D * elt, 0xff, (size_t)KVH * D * elt));
            CK(cudaMemset((char *)bufs[c][1] + r * KVH * D * elt, 0xff, (size_t)KVH * D * elt));
            if (elt == 1) {
                CK(cudaMemset((char *)bufs[c][2] + r * KVH * 4, 0xff, (size_t)KVH * 4));
                CK(cudaMemset((char *)bufs[c][3] + r * KVH * 4, 0xff, (size_t)KVH * 4));
            }
        }
    float *dx, *dfq;
    int32_t *dpos, *dts;
    void *dbf, *outa, *outb, *ws;
    const size_t out_bytes = (size_t)S * b.o_stride * 2;
    const size_t ws_bytes = dsq_attn_decode_workspace_bytes(S, H, D, splits);
    CK(cudaMalloc(&dx, x.size() * 4));
    CK(cudaMalloc(&dfq, fq.size() * 4));
    CK(cudaMalloc(&dpos, (size_t)S * 4));
    CK(cudaMalloc(&dts, (size_t)S * 4));
    CK(cudaMalloc(&dbf, (size_t)S * rs * 2));
    CK(cudaMalloc(&outa, out_bytes));
    CK(cudaMalloc(&outb, out_bytes));
    CK(cudaMalloc(&ws, ws_bytes));
    CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dfq, fq.data(), fq.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dpos, pos.data(), (size_t)S * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dts, tseq.data(), (size_t)S * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(outa, 0xff, out_bytes));
    CK(cudaMemset(outb, 0xff, out_bytes));
    CK(cudaMemset(ws, 0xff, ws_bytes));
    dsq_attn_kv kvb = b.kv;
    kvb.k = k2;
    kvb.v = v2;
    kvb.k_scale = (float *)ks2;
    kvb.v_scale = (float *)vs2;
    AK(dsq_attn_rope_kv_write(&b.kv, dx, rs, dpos, dts, S, H, dfq, dbf, 0));
    AK(dsq_attn_decode(&b.kv, dbf, rs, outa, b.o_stride, b.dlens, S, H, splits, ws, ws_bytes, 0));
    CK(cudaMemset(ws, 0xff, ws_bytes));
    AK(dsq_attn_decode_rope(&kvb, dx, rs, dfq, outb, b.o_stride, b.dlens, S, H, splits, ws, ws_bytes, 0));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> oa((size_t)S * b.o_stride), ob((size_t)S * b.o_stride);
    CK(cudaMemcpy(oa.data(), outa, out_bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ob.data(), outb, out_bytes, cudaMemcpyDeviceToHost));
    size_t odiff = 0, nonfinite = 0;
    for (int s = 0; s < S; s++)
        for (int i = 0; i < H * D; i++) {
            const size_t j = (size_t)s * b.o_stride + i;
            odiff += oa[j] != ob[j];
            nonfinite += !isfinite(dsq_bf16_to_f32(oa[j]));
        }
    /* the other loaders: the same output and the same cache bytes (each
     * rewrites cache B's new rows with what they hold) */
    const bool alt_ok = loaders_same(sc.name, "rope", splits, ob, S, H * D, b.o_stride, outb, out_bytes, ws,
                                      ws_bytes, [&](cudaStream_t st) {
                                       return dsq_attn_decode_rope(&kvb, dx, rs, dfq, outb, b.o_stride, b.dlens, S,
                                                                   H, splits, ws, ws_bytes, st);
                                   });
    /* one split: the fused kernel writing its output itself
     * (DSQ_CUDA_DECODE_DIRECT=1) gives the merge's bits; it rewrites the
     * same new K/V rows of cache B, which the byte check below still sees */
    size_t ddiff = 0;
    if (splits == 1) {
        CK(cudaMemset(outb, 0xff, out_bytes));
        CK(cudaMemset(ws, 0xff, ws_bytes));
        {
            const DirectEnv direct_path("1");
            AK(dsq_attn_decode_rope(&kvb, dx, rs, dfq, outb, b.o_stride, b.dlens, S, H, splits, ws, ws_bytes, 0));
        }
        CK(cudaDeviceSynchronize());
        std::vector<uint16_t> od((size_t)S * b.o_stride);
        CK(cudaMemcpy(od.data(), outb, out_bytes, cudaMemcpyDeviceToHost));
        ddiff = bf16_diff(ob, od, S, H * D, b.o_stride);
        printf("  %-22s rope/s1 fused, direct output vs the merge kernel: %zu bf16 values differ\n", sc.name, ddiff);
    }
    size_t cdiff = 0;
    const size_t sizes[4] = {kv_bytes, kv_bytes, elt == 1 ? sc_bytes : 0, elt == 1 ? sc_bytes : 0};
    for (int c = 0; c < 4; c++) {
        if (!sizes[c])
            continue;
        std::vector<uint8_t> ha(sizes[c]), hb(sizes[c]);
        CK(cudaMemcpy(ha.data(), bufs[0][c], sizes[c], cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hb.data(), bufs[1][c], sizes[c], cudaMemcpyDeviceToHost));
        for (size_t j = 0; j < sizes[c]; j++)
            cdiff += ha[j] != hb[j];
    }
    printf("  %-22s rope/s%-3d fused vs rope_kv_write+decode: %zu output and %zu cache bytes differ, "
           "%zu non-finite outputs\n", sc.name, splits, odiff, cdiff, nonfinite);
    void *all[] = {k2, v2, ks2, vs2, dx, dfq, dpos, dts, dbf, outa, outb, ws};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++)
        cudaFree(all[j]);
    release(b);
    return odiff == 0 && ddiff == 0 && cdiff == 0 && nonfinite == 0 && alt_ok;
}

static void test_decode_rope(void **state)
{
    (void)state;
    const int sm = n_sms();
    bool ok = true;
    /* lengths around the tile edges: the new key alone in its tile (65,
     * 129), the first key of a sequence (1), a full tile (64) */
    const std::vector<int> L = {1, 2, 64, 65, 129, 1000, 63, 130};
    std::vector<int> pos0, one(L.size(), 1);
    for (int v : L)
        pos0.push_back(v - 1);
    for (int dt = 0; dt < 2; dt++)
        for (int pg = 0; pg < 2; pg++) {
            if (g_quick && dt != pg)
                continue;
            const int sug = dsq_attn_decode_splits((int)L.size(), 2, 1000, sm, dt);
            for (int splits : {sug, 1, 3})
                ok = run_decode_rope(mk(nm(dt, pg), dt, pg, pos0, one), splits) && ok;
        }
    for (int dt = 0; dt < 2; dt++) {
        /* head_dim 64 and 18 query heads per kv head (two head groups:
         * both blocks of the last split hold the new key) */
        ok = run_decode_rope(mk(dt ? "int8/D64/g18/static" : "f16/D64/g18/static", dt, 0, {0, 99, 300},
                                {1, 1, 1}, 64, 36, 2), 4) && ok;
        ok = run_decode_rope(mk(dt ? "int8/D128/g18/paged16" : "f16/D128/g18/paged16", dt, 1, {5, 700},
                                {1, 1}, 128, 18, 1), 2) && ok;
    }
    assert_true(ok);
}

/* ---- non-finite K/V (issue 14, defect 4) -------------------------------------
 * One K or V element of one (sequence, position, kv head) is NaN or +Inf.
 * Which outputs must be non-finite is decided by the double-precision
 * reference on the cache as stored (IEEE: a NaN or +inf score, or a NaN/Inf
 * V with any weight, spreads; a -inf score is weight 0): exactly those
 * (row, head) outputs must be non-finite on the GPU, all others finite and
 * within the usual tolerance.  Before the fix the kernels dropped NaN (F16
 * stores saturated NaN to -65504, the INT8 absmax skipped NaN, the decode
 * merge turned a NaN sum into 0) and, in prefill, a NaN/Inf V of a later
 * token (weight 0 after the causal mask) still poisoned earlier rows. */
static int g_nf_loader = DSQ_ATTN_LOADER_CP_ASYNC; /* the decode cases' loader */
static bool run_nonfinite(const Scenario &sc, bool decode, int splits)
{
    Built b;
    memset(&b.kv, 0, sizeof b.kv);
    build(sc, b);
    const int D = sc.D, H = sc.H, KVH = sc.KVH, G = H / KVH;
    const int n_out = decode ? b.n_seqs : b.n_new;
    size_t out_bytes = (size_t)n_out * b.o_stride * 2;
    void *dout, *ws = NULL;
    size_t ws_bytes = 0;
    CK(cudaMalloc(&dout, out_bytes));
    CK(cudaMemset(dout, 0xff, out_bytes));
    if (decode) {
        ws_bytes = dsq_attn_decode_workspace_bytes(b.n_seqs, H, D, splits);
        CK(cudaMalloc(&ws, ws_bytes));
        CK(cudaMemset(ws, 0xff, ws_bytes));
        const LoaderEnv loader(g_nf_loader);
        AK(dsq_attn_decode(&b.kv, b.dqkv_new, b.q_stride, dout, b.o_stride, b.dlens, b.n_seqs, H, splits, ws,
                           ws_bytes, 0));
    } else if (splits > 0) { /* split every `splits` tiles of keys */
        int max_kv = 0;
        for (int s = 0; s < b.n_seqs; s++)
            max_kv = std::max(max_kv, sc.pos0[s] + sc.n[s]);
        const int n_split = ((max_kv + 63) / 64 + splits - 1) / splits;
        ws_bytes = std::max(dsq_attn_prefill_workspace_bytes(b.n_seqs * b.max_n, H, D, n_split), (size_t)16);
        CK(cudaMalloc(&ws, ws_bytes));
        CK(cudaMemset(ws, 0xff, ws_bytes));
        AK(dsq_attn_prefill_ws(&b.kv, b.dqkv_new, b.q_stride, dout, b.o_stride, b.dcu, b.dpos0, b.n_seqs, b.max_n,
                               max_kv, H, splits, ws, ws_bytes, 0));
    } else {
        AK(dsq_attn_prefill(&b.kv, b.dqkv_new, b.q_stride, dout, b.o_stride, b.dcu, b.dpos0,
                            b.n_seqs, b.max_n, H, 0));
    }
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> out((size_t)n_out * b.o_stride);
    CK(cudaMemcpy(out.data(), dout, out_bytes, cudaMemcpyDeviceToHost));
    int want_bad = 0, got_bad = 0, wrong = 0;
    Err e;
    std::vector<double> ref(D);
    for (int s = 0; s < b.n_seqs; s++)
        for (int i = 0; i < sc.n[s]; i++) {
            const int orow = decode ? s : b.cu[s] + i;
            const float *q = &b.q[(size_t)(b.cu[s] + i) * H * D];
            for (int h = 0; h < H; h++) {
                ref_attend(q + h * D, b.kd[s].data(), b.vd[s].data(), h / G, KVH, D,
                           sc.pos0[s] + i + 1, ref.data());
                bool rb = false, gb = false;
                for (int d = 0; d < D; d++) {
                    rb = rb || !std::isfinite(ref[d]);
                    gb = gb || !std::isfinite(dsq_bf16_to_f32(out[(size_t)orow * b.o_stride + h * D + d]));
                }
                want_bad += rb;
                got_bad += gb;
                if (rb != gb) {
                    if (wrong < 5)
                        printf("    seq %d pos %d head %d: reference %s, GPU %s\n", s,
                               sc.pos0[s] + i, h, rb ? "non-finite" : "finite",
                               gb ? "non-finite" : "finite");
                    wrong++;
                } else if (!rb) {
                    for (int d = 0; d < D; d++)
                        e.add(dsq_bf16_to_f32(out[(size_t)orow * b.o_stride + h * D + d]), ref[d],
                              ref[d]);
                }
            }
        }
    char what[24];
    const char *de = getenv("DSQ_CUDA_DECODE_DIRECT");
    snprintf(what, sizeof what, "%s%s%s", decode ? "decode" : splits ? "pre/k1" : "prefill", decode ? "" : "/",
             decode ? (splits == 1 && !(de && de[0] == '0') ? "/direct"
                       : g_nf_loader == DSQ_ATTN_LOADER_BULK ? "/bulk"
                       : g_nf_loader == DSQ_ATTN_LOADER_LEAN ? "/lean"
                                                              : "")
                    : prefill_kernel_name(sc.dtype));
    printf("  %-12s %-13s %s[%d] = %-4g at seq %d pos %4d: non-finite (row, head) outputs: "
           "reference %4d, GPU %4d, mismatched %d; finite ones rel %.2e\n",
           sc.name, what, sc.inj_side ? "V" : "K", sc.inj_head,
           (double)sc.inj_val, sc.inj_seq, sc.inj_pos, want_bad, got_bad, wrong, e.rel());
    cudaFree(dout);
    cudaFree(ws);
    release(b);
    /* the injection must matter somewhere, or the case tests nothing */
    return wrong == 0 && want_bad > 0 && e.rel() < kTol;
}

static void test_nonfinite_kv(void **state)
{
    (void)state;
    bool ok = true;
    const float vals[2] = {NAN, INFINITY};
    for (int dt = 0; dt < 2; dt++)
        for (int side = 0; side < 2; side++)
            for (int vi = 0; vi < 2; vi++) {
                /* prefill: the bad token sits inside the first tile of a
                 * 70-token prompt (rows before it share its tile and its
                 * warp's 16 rows), and in a prompt extending a cache */
                Scenario p = mk(nm(dt, dt), dt, dt, {0, 10, 0}, {70, 40, 5});
                p.inj_head = 1;
                p.inj_side = side;
                p.inj_val = vals[vi];
                /* each prefill case unsplit, then split every tile of keys,
                 * with every prefill kernel */
                for (int sp = 0; sp < 2 * g_pre_kernels; sp++) {
                    set_prefill_kernel(sp < 2 && g_pre_kernels == 2);
                    p.inj_seq = 0;
                    p.inj_pos = 37;
                    ok = run_nonfinite(p, false, sp % 2) && ok;
                    p.inj_seq = 1;
                    p.inj_pos = 3; /* cached part: every new row attends to it */
                    ok = run_nonfinite(p, false, sp % 2) && ok;
                    p.inj_seq = 0;
                    p.inj_pos = 66; /* second tile, second block of query rows */
                    ok = run_nonfinite(p, false, sp % 2) && ok;
                }
                set_prefill_kernel(-1);
                /* decode: a cached token, then the current one; splits merge */
                Scenario d = mk(nm(dt, dt), dt, dt, {99, 36, 0}, {1, 1, 1});
                d.inj_seq = 0;
                d.inj_pos = 50;
                d.inj_head = 1;
                d.inj_side = side;
                d.inj_val = vals[vi];
                {
                    const DirectEnv merge_path("0"); /* one split through the merge kernel */
                    ok = run_nonfinite(d, true, 1) && ok;
                }
                {
                    const DirectEnv direct_path("1"); /* one split written out by the decode kernel */
                    ok = run_nonfinite(d, true, 1) && ok;
                }
                /* cp.async, bulk copies where the device has them, lean cp.async */
                for (int ld : {DSQ_ATTN_LOADER_CP_ASYNC, DSQ_ATTN_LOADER_BULK, DSQ_ATTN_LOADER_LEAN}) {
                    g_nf_loader = ld;
                    {
                        const LoaderEnv on(ld);
                        if (dsq_attn_decode_loader() != ld) {
                            printf("  non-finite K/V with the %s loader: %s\n", loader_name(ld),
                                   ld == DSQ_ATTN_LOADER_BULK ? "not available on this device, not run"
                                                              : "NOT chosen (dispatch bug)");
                            ok = ok && ld == DSQ_ATTN_LOADER_BULK;
                            continue;
                        }
                    }
                    d.inj_pos = 50;
                    ok = run_nonfinite(d, true, 3) && ok;
                    d.inj_pos = 99;
                    ok = run_nonfinite(d, true, 2) && ok;
                }
                g_nf_loader = DSQ_ATTN_LOADER_CP_ASYNC;
            }
    assert_true(ok);
}

static void test_invalid_args(void **state)
{
    (void)state;
    dsq_attn_kv kv;
    memset(&kv, 0, sizeof kv);
    void *p;
    CK(cudaMalloc(&p, 1 << 20));
    kv.k = kv.v = p;
    kv.block_table = (const int32_t *)p;
    kv.bt_stride = 1;
    kv.block_size = 16;
    kv.n_kv_heads = 2;
    kv.head_dim = 96; /* unsupported */
    kv.dtype = DSQ_ATTN_KV_F16;
    int32_t *ip = (int32_t *)p;
    assert_int_equal(dsq_attn_prefill(&kv, p, 2048, p, 2048, ip, ip, 1, 1, 12, 0),
                     DSQ_ERR_INTERNAL);
    kv.head_dim = 128;
    /* 12 heads not a multiple of 5 kv heads */
    kv.n_kv_heads = 5;
    assert_int_equal(dsq_attn_decode(&kv, p, 2048, p, 2048, ip, 1, 12, 1, p, 1 << 20, 0),
                     DSQ_ERR_INTERNAL);
    kv.n_kv_heads = 2;
    /* workspace too small */
    assert_int_equal(dsq_attn_decode(&kv, p, 2048, p, 2048, ip, 4, 12, 8, p,
                                     dsq_attn_decode_workspace_bytes(4, 12, 128, 8) - 1, 0),
                     DSQ_ERR_INTERNAL);
    assert_non_null(strstr(dsq_last_error_message(), "workspace")); /* the message names the problem */
    /* fused RoPE: no inv_freq; a row stride that cannot hold the k and v
     * heads (12 q + 2 x 2 kv heads of 128 = 2048 floats) */
    const float *fp = (const float *)p;
    assert_int_equal(dsq_attn_decode_rope(&kv, fp, 2048, NULL, p, 2048, ip, 1, 12, 1, p, 1 << 20, 0),
                     DSQ_ERR_INTERNAL);
    assert_int_equal(dsq_attn_decode_rope(&kv, fp, 2047, fp, p, 2048, ip, 1, 12, 1, p, 1 << 20, 0),
                     DSQ_ERR_INTERNAL);
    assert_non_null(strstr(dsq_last_error_message(), "RoPE"));
    /* INT8 without scales */
    kv.dtype = DSQ_ATTN_KV_INT8;
    assert_int_equal(dsq_attn_kv_write(&kv, p, 2048, p, 2048, ip, ip, 1, 0),
                     DSQ_ERR_INTERNAL);
    CK(cudaFree(p));
    CK(cudaGetLastError());
}

/* ---- timing (informative) ------------------------------------------------------ */

__global__ void fill_random(uint32_t *p, size_t n_words, uint32_t seed, uint32_t mask)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_words;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t x = (uint32_t)i * 2654435761u ^ seed;
        x ^= x >> 15;
        x *= 2246822519u;
        x ^= x >> 13;
        p[i] = x & mask;
    }
}
__global__ void fill_const(float *p, size_t n, float v)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

static int g_profile = 0; /* DSQ_ATTN_PROFILE=1: one launch per config (the planned splits), for ncu */

/* Median time of one fn() call: `reps` calls captured into one CUDA graph
 * (how the backend runs a decode step: no host launch cost in the numbers),
 * replayed 5 times after a warm-up replay. */
static float time_ms(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int reps,
                     void (*fn)(void *, int, cudaStream_t), void *arg)
{
    if (g_profile) {
        fn(arg, 0, st);
        CK(cudaStreamSynchronize(st));
        return 1.0f;
    }
    cudaGraph_t g;
    cudaGraphExec_t x;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < reps; i++)
        fn(arg, i, st);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    CK(cudaGraphLaunch(x, st));
    std::vector<float> t;
    for (int r = 0; r < 5; r++) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(x, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms / reps);
    }
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    std::sort(t.begin(), t.end());
    return t[2];
}

struct DecBench {
    dsq_attn_kv kv;
    const int32_t *bt;
    void *q, *out, *ws;
    size_t ws_bytes;
    int32_t *lens;
    int batch, splits, slots;
};
static void dec_fn(void *a, int i, cudaStream_t st)
{
    DecBench *d = (DecBench *)a;
    dsq_attn_kv kv = d->kv;
    /* rotate the slots so batch 1 does not run out of L2 */
    kv.block_table = d->bt + (d->batch == 1 ? i % d->slots : 0);
    AK(dsq_attn_decode(&kv, d->q, 12 * 128, d->out, 12 * 128, d->lens, d->batch, 12, d->splits,
                       d->ws, d->ws_bytes, st));
}

struct PreBench {
    dsq_attn_kv kv;
    void *q, *out, *ws;
    size_t ws_bytes;
    int32_t *cu, *pos0;
    int n, kv_len, split_tiles;
};
static void pre_fn(void *a, int i, cudaStream_t st)
{
    (void)i;
    PreBench *p = (PreBench *)a;
    AK(dsq_attn_prefill_ws(&p->kv, p->q, 12 * 128, p->out, 12 * 128, p->cu, p->pos0, 1, p->n, p->kv_len, 12,
                           p->split_tiles, p->ws, p->ws_bytes, st));
}

static void test_timing(void **state)
{
    (void)state;
    if (g_quick)
        skip();
    /* DSQ_ATTN_PROFILE_CTX=n: another context length (profiling only) */
    const char *pc = getenv("DSQ_ATTN_PROFILE_CTX");
    const int ctx = g_profile && pc && atoi(pc) >= 64 ? atoi(pc) : 4096, slots = 64, KVH = 2, D = 128, H = 12;
    const int sm = n_sms();
    cudaEvent_t e0, e1;
    cudaStream_t st;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    printf("\n  decode attention, context %d, 12 q / 2 kv heads, D 128 (KV read / time):\n", ctx);
    for (int dt = 0; dt < 2; dt++) {
        const size_t elt = dt ? 1 : 2;
        const size_t rows = (size_t)slots * ctx;
        const size_t kv_bytes = rows * KVH * D * elt;
        DecBench d;
        memset(&d, 0, sizeof d);
        void *k, *v;
        float *ks = NULL, *vs = NULL;
        CK(cudaMalloc(&k, kv_bytes));
        CK(cudaMalloc(&v, kv_bytes));
        /* fp16: random mantissas, exponent capped (|x| < 2); int8: any byte */
        uint32_t mask = dt ? 0xffffffffu : 0xbfffbfffu;
        fill_random<<<1024, 256>>>((uint32_t *)k, kv_bytes / 4, 1, mask);
        fill_random<<<1024, 256>>>((uint32_t *)v, kv_bytes / 4, 2, mask);
        if (dt) {
            CK(cudaMalloc(&ks, rows * KVH * 4));
            CK(cudaMalloc(&vs, rows * KVH * 4));
            fill_const<<<1024, 256>>>(ks, rows * KVH, 0.01f);
            fill_const<<<1024, 256>>>(vs, rows * KVH, 0.01f);
        }
        std::vector<int32_t> bt(slots), lens(slots, ctx);
        for (int i = 0; i < slots; i++)
            bt[i] = i;
        int32_t *dbt, *dlens;
        CK(cudaMalloc(&dbt, slots * 4));
        CK(cudaMalloc(&dlens, slots * 4));
        CK(cudaMemcpy(dbt, bt.data(), slots * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dlens, lens.data(), slots * 4, cudaMemcpyHostToDevice));
        d.kv.k = k;
        d.kv.v = v;
        d.kv.k_scale = ks;
        d.kv.v_scale = vs;
        d.kv.block_table = dbt;
        d.kv.bt_stride = 1;
        d.kv.block_size = ctx;
        d.kv.n_kv_heads = KVH;
        d.kv.head_dim = D;
        d.kv.dtype = dt;
        d.bt = dbt;
        d.lens = dlens;
        d.slots = slots;
        CK(cudaMalloc(&d.q, (size_t)slots * H * D * 2));
        CK(cudaMalloc(&d.out, (size_t)slots * H * D * 2));
        fill_random<<<64, 256>>>((uint32_t *)d.q, (size_t)slots * H * D / 2, 3, 0x3fff3fffu);
        d.ws_bytes = dsq_attn_decode_workspace_bytes(slots, H, D, 256);
        CK(cudaMalloc(&d.ws, d.ws_bytes));
        CK(cudaDeviceSynchronize());
        const int batches[2] = {1, 64};
        for (int bi = 0; bi < 2; bi++) {
            d.batch = batches[bi];
            int sug = dsq_attn_decode_splits(d.batch, KVH, ctx, sm, dt);
            int cands[] = {sug, 2, 3, 4, 6, 8, 16, 32, 64};
            for (int c = 0; c < 9; c++) {
                if ((c > 0 && cands[c] == sug) || (g_profile && c != 0))
                    continue;
                d.splits = cands[c];
                float ms = time_ms(st, e0, e1, 50, dec_fn, &d);
                double bytes = (double)d.batch * ctx * KVH * D * 2 * elt +
                               (dt ? (double)d.batch * ctx * KVH * 2 * 4 : 0);
                printf("    %-4s batch %2d splits %3d%s: %8.2f us  %7.1f GB/s  (%4.1f%% of 4480)\n",
                       dt ? "int8" : "f16", d.batch, d.splits, c == 0 ? "*" : " ", ms * 1e3,
                       bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / 4.48e12);
            }
        }
        /* prefill of one 4096-token prompt over the same cache (slot 0) */
        PreBench p;
        p.kv = d.kv;
        p.n = ctx;
        p.q = d.q; /* reuse: only 64 rows are random, enough for timing */
        int32_t cu[2] = {0, ctx}, z = 0;
        void *qbig, *obig;
        CK(cudaMalloc(&qbig, (size_t)ctx * H * D * 2));
        CK(cudaMalloc(&obig, (size_t)ctx * H * D * 2));
        fill_random<<<256, 256>>>((uint32_t *)qbig, (size_t)ctx * H * D / 2, 5, 0x3fff3fffu);
        p.q = qbig;
        p.out = obig;
        CK(cudaMalloc(&p.cu, 8));
        CK(cudaMalloc(&p.pos0, 4));
        CK(cudaMemcpy(p.cu, cu, 8, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(p.pos0, &z, 4, cudaMemcpyHostToDevice));
        p.ws = NULL;
        p.ws_bytes = 0;
        p.kv_len = ctx;
        p.split_tiles = 0;
        CK(cudaDeviceSynchronize()); /* fills ran on the legacy stream */
        /* short prompts and chunks (the backend's split plan: a workspace of
         * 16 splits of 512 rows, as backend_memory.cu sizes it), one layer;
         * every row with each prefill kernel the device runs */
        const size_t ws_bytes = dsq_attn_prefill_workspace_bytes(512, H, D, 16);
        void *ws512;
        CK(cudaMalloc(&ws512, ws_bytes));
        for (int kn = 0; kn < g_pre_kernels; kn++) {
            set_prefill_kernel(kn == 0 && g_pre_kernels == 2);
            const char *kname = prefill_kernel_name(dt ? DSQ_ATTN_KV_INT8 : DSQ_ATTN_KV_F16);
            p.n = ctx;
            p.kv_len = ctx;
            p.ws = NULL;
            p.ws_bytes = 0;
            int32_t cu4k[2] = {0, ctx};
            CK(cudaMemcpy(p.cu, cu4k, 8, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(p.pos0, &z, 4, cudaMemcpyHostToDevice));
            float ms = time_ms(st, e0, e1, 10, pre_fn, &p);
            double flops = 4.0 * D * H * ((double)ctx * (ctx + 1) / 2);
            printf("    %-4s %-5s prefill 1 x %d tokens: %8.2f us  %6.1f TFLOP/s (causal)\n", dt ? "int8" : "f16",
                   kname, ctx, ms * 1e3, flops / (ms * 1e-3) / 1e12);
            p.ws = ws512;
            p.ws_bytes = ws_bytes;
            const int shorts[][2] = {{512, 0}, {256, 0}, {128, 0}, {512, 1536}, {512, 3584}};
            for (int si = 0; si < 5; si++) {
                const int n = shorts[si][0], at = shorts[si][1];
                int32_t cus[2] = {0, n};
                CK(cudaMemcpy(p.cu, cus, 8, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(p.pos0, &at, 4, cudaMemcpyHostToDevice));
                p.n = n;
                p.kv_len = at + n;
                double fl = 4.0 * D * H * ((double)n * at + (double)n * (n + 1) / 2);
                for (int sp = 1; sp >= 0; sp--) {
                    void *w = p.ws;
                    if (!sp)
                        p.ws = NULL;
                    float t = time_ms(st, e0, e1, 20, pre_fn, &p);
                    p.ws = w;
                    printf("    %-4s %-5s prefill %4d rows at %4d%s: %8.2f us  %6.1f TFLOP/s\n", dt ? "int8" : "f16",
                           kname, n, at, sp ? " (split plan)" : " (no split)  ", t * 1e3, fl / (t * 1e-3) / 1e12);
                }
                /* other split sizes than the plan's (512 rows at 0: 2 tiles) */
                for (int ft = 1; si == 0 && ft <= 4; ft++) {
                    if (ft == 2)
                        continue;
                    p.split_tiles = ft;
                    float t = time_ms(st, e0, e1, 20, pre_fn, &p);
                    p.split_tiles = 0;
                    printf("    %-4s %-5s prefill %4d rows at %4d (%d-tile splits): %8.2f us  %6.1f TFLOP/s\n",
                           dt ? "int8" : "f16", kname, n, at, ft, t * 1e3, fl / (t * 1e-3) / 1e12);
                }
            }
        }
        set_prefill_kernel(-1);
        p.ws = ws512;
        cudaFree(p.ws);
        cudaFree(qbig);
        cudaFree(obig);
        cudaFree(p.cu);
        cudaFree(p.pos0);
        cudaFree(k);
        cudaFree(v);
        cudaFree(ks);
        cudaFree(vs);
        cudaFree(dbt);
        cudaFree(dlens);
        cudaFree(d.q);
        cudaFree(d.out);
        cudaFree(d.ws);
    }
    CK(cudaGetLastError());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(st);
}

static void test_summary(void **state)
{
    (void)state;
    printf("\n  worst rel error vs reference on the stored cache: f16 %.3e, int8 %.3e"
           " (bound %.1e); int8 vs unquantized K/V %.3e\n",
           g_worst_f16, g_worst_i8, kTol, g_worst_i8_true);
    for (int ld : {DSQ_ATTN_LOADER_BULK, DSQ_ATTN_LOADER_LEAN})
        printf("  launches with the %s loader checked bit for bit against cp.async: %zu%s\n", loader_name(ld),
               g_alt_checked[ld], g_alt_unavailable[ld] ? " (not available on this device)" : "");
}

int main(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        return DSQ_TEST_SKIP;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major < 8) {
        printf("SKIP: attention kernels need sm_80 or newer\n");
        return DSQ_TEST_SKIP;
    }
    const char *qk = getenv("DSQ_ATTN_QUICK");
    g_quick = qk && *qk && *qk != '0';
    const char *pf = getenv("DSQ_ATTN_PROFILE");
    g_profile = pf && *pf && *pf != '0';
    printf("device: %s, %d SMs%s\n", prop.name, prop.multiProcessorCount,
           g_quick ? " (quick mode)" : "");
    const int wg = dsq_attn_prefill_kernel_wgmma(DSQ_ATTN_KV_F16);
    g_pre_kernels = wg == 1 ? 2 : 1;
    printf("prefill kernels tested: %s%s\n", wg == 1 ? "wgmma (FP16's default) and mma.sync (INT8's)" : "mma.sync",
           wg != 1 && prop.major == 9 && prop.minor == 0 ? " -- NOTE: this build has no sm_90a code, so the "
                                                           "wgmma kernel is not tested" : "");
    if (g_profile) {
        const struct CMUnitTest prof[] = {cmocka_unit_test(test_timing)};
        return cmocka_run_group_tests(prof, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_args),  cmocka_unit_test(test_prefill_short),
        cmocka_unit_test(test_decode_batch),  cmocka_unit_test(test_decode_rope),
        cmocka_unit_test(test_other_shapes),
        cmocka_unit_test(test_nonfinite_kv),
        cmocka_unit_test(test_prefill_long),  cmocka_unit_test(test_timing),
        cmocka_unit_test(test_summary),
    };
    /* DSQ_TEST_FILTER=test_decode_*: some tests (cmocka's wildcard pattern) */
    if (getenv("DSQ_TEST_FILTER"))
        cmocka_set_test_filter(getenv("DSQ_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
