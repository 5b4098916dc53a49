/* rope.cuh - the rotation of one (i, i + D/2) pair, shared by rope.cu and
 * the fused RoPE + KV write of kv_write.cu so both round identically. */
#ifndef DSQ_CUDA_ROPE_CUH
#define DSQ_CUDA_ROPE_CUH

/* The angle as HF computes it: (float)pos times fp32 inv_freq, one rounding,
 * then full-precision sincosf (positions reach thousands of radians;
 * __sincosf would drift).  q*cos + rotate_half(q)*sin, rotate_half(q) =
 * (-q[half:], q[:half]). */
__device__ __forceinline__ void dsq_rope_pair(float &a, float &b, int pos, float inv_freq)
{
    const float ang = (float)pos * inv_freq;
    float s, c;
    sincosf(ang, &s, &c);
    const float ra = a * c - b * s;
    const float rb = b * c + a * s;
    a = ra;
    b = rb;
}

#endif
