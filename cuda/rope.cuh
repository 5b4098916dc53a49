/* rope.cuh - the rotation of one (i, i + D/2) pair, shared by rope.cu, the
 * fused RoPE + KV write of kv_write.cu and the decode attention that applies
 * RoPE itself (attention_decode.cu), so all of them round identically. */
#ifndef DSQ_CUDA_ROPE_CUH
#define DSQ_CUDA_ROPE_CUH

/* cos and sin of the angle as HF computes it: (float)pos times fp32
 * inv_freq, one rounding, then full-precision sincosf (positions reach
 * thousands of radians; __sincosf would drift). */
__device__ __forceinline__ void dsq_rope_cs(int pos, float inv_freq, float &c, float &s)
{
    const float ang = (float)pos * inv_freq;
    sincosf(ang, &s, &c);
}

/* q*cos + rotate_half(q)*sin, rotate_half(q) = (-q[half:], q[:half]).
 * Explicit roundings (no FMA contraction): every kernel that inlines this
 * gets the same bits whatever the compiler does around it, and they are the
 * bits of the CPU backend's plain fp32 arithmetic. */
__device__ __forceinline__ void dsq_rope_rot(float &a, float &b, float c, float s)
{
    const float ra = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    const float rb = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
    a = ra;
    b = rb;
}

__device__ __forceinline__ void dsq_rope_pair(float &a, float &b, int pos, float inv_freq)
{
    float c, s;
    dsq_rope_cs(pos, inv_freq, c, s);
    dsq_rope_rot(a, b, c, s);
}

#endif
