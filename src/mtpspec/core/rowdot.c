/* Row-invariant fp32 and bf16 kernels for CPUs with AVX2 + FMA (see native.py).
 *
 * Every output is a dot product (or, in `mix_f32`, a weighted sum) computed in ONE fixed
 * order: eight lanes over the reduction index, then a fixed tree over the lanes, then the
 * tail in index order. Which other rows are in the call, and how the work is split between
 * threads, never changes that order, so row r of a result depends only on row r of the input:
 * a verify pass over k + 1 tokens yields, bit for bit, the rows of k + 1 one-token passes.
 * The weights stream once per call for all rows (two rows share each loaded weight vector),
 * so extra rows cost little where memory traffic bounds the call. bf16 operands are widened
 * exactly to fp32, multiplied and summed in fp32, and rounded once: a bf16 matmul's semantics,
 * at half of fp32's memory traffic.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

static inline float hsum(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* i + (i+4) */
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));                                    /* + (i+2) */
    return _mm_cvtss_f32(_mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1)));               /* + (i+1) */
}

/* Loads of eight values as fp32: fp32 as they are, bf16 widened exactly (its bits are the top
 * half of an fp32). Stores: fp32 as is, bf16 rounded to nearest even (as torch rounds). */
static inline __m256 ld_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline __m256 ld_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline float one_f32(const float *p) { return *p; }
static inline float one_bf16(const uint16_t *p) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)*p << 16};
    return v.f;
}
static inline void st_f32(float *p, float x) { *p = x; }
static inline void st_bf16(uint16_t *p, float x) {
    union { float f; uint32_t u; } v = {.f = x};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) { *p = (uint16_t)((v.u >> 16) | 0x40); return; } /* NaN stays NaN */
    *p = (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
static inline void st8_f32(float *p, __m256 x) { _mm256_storeu_ps(p, x); }
static inline void st8_bf16(uint16_t *p, __m256 x) {
    float t[8];
    _mm256_storeu_ps(t, x);
    for (int i = 0; i < 8; i++) st_bf16(p + i, t[i]);
}

#define OB 4 /* outputs per block: four weight rows stream side by side */
#define RB 2 /* input rows per block: each loaded weight vector serves two rows */

/* y[b] (R, O) = x[b] (R, I) @ w[b] (O, I)^T for b < nb; xs, ws, ys: batch strides in elements. */
#define ROWDOT(NAME, TX, LX, OX, TW, LW, OW, TY, SY)                                                   \
void NAME(const TX *x, const TW *w, TY *y, int nb, int R, int I, int O, long xs, long ws, long ys) {  \
    const int blocks = (O + OB - 1) / OB, I8 = I & ~7;                                                 \
    _Pragma("omp parallel for collapse(2) schedule(static)")                                           \
    for (int b = 0; b < nb; b++) {                                                                     \
        for (int ob = 0; ob < blocks; ob++) {                                                          \
            const int o0 = ob * OB, no = O - o0 < OB ? O - o0 : OB;                                    \
            const TW *wr[OB];                                                                          \
            for (int j = 0; j < OB; j++) wr[j] = w + b * ws + (size_t)(o0 + (j < no ? j : 0)) * I;     \
            for (int r0 = 0; r0 < R; r0 += RB) {                                                       \
                const int nr = R - r0 < RB ? R - r0 : RB;                                              \
                const TX *xr[RB];                                                                      \
                for (int i = 0; i < RB; i++) xr[i] = x + b * xs + (size_t)(r0 + (i < nr ? i : 0)) * I; \
                __m256 acc[RB][OB];                                                                    \
                for (int i = 0; i < RB; i++)                                                           \
                    for (int j = 0; j < OB; j++) acc[i][j] = _mm256_setzero_ps();                      \
                for (int k = 0; k < I8; k += 8) {                                                      \
                    __m256 wv[OB];                                                                     \
                    for (int j = 0; j < OB; j++) wv[j] = LW(wr[j] + k);                                \
                    for (int i = 0; i < RB; i++) {                                                     \
                        const __m256 xv = LX(xr[i] + k);                                               \
                        for (int j = 0; j < OB; j++) acc[i][j] = _mm256_fmadd_ps(wv[j], xv, acc[i][j]); \
                    }                                                                                  \
                }                                                                                      \
                for (int i = 0; i < nr; i++)                                                           \
                    for (int j = 0; j < no; j++) {                                                     \
                        float s = hsum(acc[i][j]);                                                     \
                        for (int k = I8; k < I; k++) s += OW(wr[j] + k) * OX(xr[i] + k);               \
                        SY(y + b * ys + (size_t)(r0 + i) * O + o0 + j, s);                             \
                    }                                                                                  \
            }                                                                                          \
        }                                                                                              \
    }                                                                                                  \
}
ROWDOT(rowdot_f32, float, ld_f32, one_f32, float, ld_f32, one_f32, float, st_f32)
/* bf16 inputs and weights, fp32 products and sums, rounded once to bf16 (or kept in fp32:
 * attention scores) */
ROWDOT(rowdot_bf16, uint16_t, ld_bf16, one_bf16, uint16_t, ld_bf16, one_bf16, uint16_t, st_bf16)
ROWDOT(rowdot_bf16_f32, uint16_t, ld_bf16, one_bf16, uint16_t, ld_bf16, one_bf16, float, st_f32)

/* y[b] (R, D) = p[b] (R, S) @ v[b] (S, D), p fp32: each output row sums p[r, s] * v[s] over s
 * in order, skipping exact zeros (masked slots: the same slots for a row alone or among
 * others). D a multiple of 8 and at most 256. */
#define MIX(NAME, TV, LV, TY, SY8)                                                                     \
void NAME(const float *p, const TV *v, TY *y, int nb, int R, int S, int D, long ps, long vs, long ys) { \
    _Pragma("omp parallel for collapse(2) schedule(static)")                                           \
    for (int b = 0; b < nb; b++) {                                                                     \
        for (int r = 0; r < R; r++) {                                                                  \
            const float *pr = p + b * ps + (size_t)r * S;                                              \
            const TV *vb = v + b * vs;                                                                 \
            __m256 acc[32];                                                                            \
            const int n8 = D / 8;                                                                      \
            for (int j = 0; j < n8; j++) acc[j] = _mm256_setzero_ps();                                 \
            for (int s = 0; s < S; s++) {                                                              \
                if (pr[s] == 0.0f) continue;                                                           \
                const __m256 pv = _mm256_set1_ps(pr[s]);                                               \
                for (int j = 0; j < n8; j++)                                                           \
                    acc[j] = _mm256_fmadd_ps(pv, LV(vb + (size_t)s * D + 8 * j), acc[j]);              \
            }                                                                                          \
            for (int j = 0; j < n8; j++) SY8(y + b * ys + (size_t)r * D + 8 * j, acc[j]);              \
        }                                                                                              \
    }                                                                                                  \
}
MIX(mix_f32, float, ld_f32, float, st8_f32)
MIX(mix_bf16, uint16_t, ld_bf16, uint16_t, st8_bf16)

#ifdef __AVX512F__
/* The same contract for fp32 on AVX-512 CPUs: sixteen lanes over the reduction index (the tail
 * through a masked load, so every output is one vector chain), reduced by one fixed shuffle
 * tree; four weight rows by up to four input rows per block, so extra rows share each loaded
 * weight vector. Built only with -mavx512f (native.py adds it where the CPU has AVX-512F). */
static inline __mmask16 tail16(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

static inline __attribute__((always_inline)) void block512(const float *const *xr, const float *const *wr, int I,
                                                           float *y, int O, int r0, int o0, int no, const int NR) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < I; k += 16) {
        const __mmask16 m = tail16(I - k);
        __m512 wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) wv[j] = _mm512_maskz_loadu_ps(m, wr[j] + k);
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            const __m512 xv = _mm512_maskz_loadu_ps(m, xr[i] + k);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        float out[4]; /* constant indices: the accumulators stay in registers */
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) out[j] = _mm512_reduce_add_ps(acc[i][j]);
        for (int j = 0; j < no; j++) y[(size_t)(r0 + i) * O + o0 + j] = out[j];
    }
}

void rowdot512_f32(const float *x, const float *w, float *y, int nb, int R, int I, int O, long xs, long ws, long ys) {
    const int blocks = (O + 3) / 4;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < nb; b++) {
        for (int ob = 0; ob < blocks; ob++) {
            const int o0 = ob * 4, no = O - o0 < 4 ? O - o0 : 4;
            const float *wr[4];
            for (int j = 0; j < 4; j++) wr[j] = w + b * ws + (size_t)(o0 + (j < no ? j : 0)) * I;
            for (int r0 = 0; r0 < R; r0 += 4) {
                const float *xr[4];
                for (int i = 0; i < 4; i++) xr[i] = x + b * xs + (size_t)(r0 + (r0 + i < R ? i : 0)) * I;
                float *yb = y + b * ys;
                switch (R - r0 < 4 ? R - r0 : 4) {
                    case 1: block512(xr, wr, I, yb, O, r0, o0, no, 1); break;
                    case 2: block512(xr, wr, I, yb, O, r0, o0, no, 2); break;
                    case 3: block512(xr, wr, I, yb, O, r0, o0, no, 3); break;
                    default: block512(xr, wr, I, yb, O, r0, o0, no, 4); break;
                }
            }
        }
    }
}
#endif
