/* Row-invariant fp32 kernels for CPUs with AVX2 + FMA (see native.py).
 *
 * Every output is a dot product (or, in `mix_f32`, a weighted sum) computed in ONE fixed
 * order: eight lanes over the reduction index, then a fixed tree over the lanes, then the
 * tail in index order. Which other rows are in the call, and how the work is split between
 * threads, never changes that order, so row r of a result depends only on row r of the input:
 * a verify pass over k + 1 tokens yields, bit for bit, the rows of k + 1 one-token passes.
 * The weights stream once per call for all rows (two rows share each loaded weight vector),
 * so extra rows cost little where memory traffic bounds the call.
 */
#include <immintrin.h>
#include <stddef.h>

static inline float hsum(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* i + (i+4) */
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));                                    /* + (i+2) */
    return _mm_cvtss_f32(_mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1)));               /* + (i+1) */
}

#define OB 4 /* outputs per block: four weight rows stream side by side */
#define RB 2 /* input rows per block: each loaded weight vector serves two rows */

/* y[b] (R, O) = x[b] (R, I) @ w[b] (O, I)^T for b < nb; xs, ws, ys: batch strides in floats. */
void rowdot_f32(const float *x, const float *w, float *y, int nb, int R, int I, int O,
                long xs, long ws, long ys) {
    const int blocks = (O + OB - 1) / OB, I8 = I & ~7;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < nb; b++) {
        for (int ob = 0; ob < blocks; ob++) {
            const int o0 = ob * OB, no = O - o0 < OB ? O - o0 : OB;
            const float *wr[OB];
            for (int j = 0; j < OB; j++) wr[j] = w + b * ws + (size_t)(o0 + (j < no ? j : 0)) * I;
            for (int r0 = 0; r0 < R; r0 += RB) {
                const int nr = R - r0 < RB ? R - r0 : RB;
                const float *xr[RB];
                for (int i = 0; i < RB; i++) xr[i] = x + b * xs + (size_t)(r0 + (i < nr ? i : 0)) * I;
                __m256 acc[RB][OB];
                for (int i = 0; i < RB; i++)
                    for (int j = 0; j < OB; j++) acc[i][j] = _mm256_setzero_ps();
                for (int k = 0; k < I8; k += 8) {
                    __m256 wv[OB];
                    for (int j = 0; j < OB; j++) wv[j] = _mm256_loadu_ps(wr[j] + k);
                    for (int i = 0; i < RB; i++) {
                        const __m256 xv = _mm256_loadu_ps(xr[i] + k);
                        for (int j = 0; j < OB; j++) acc[i][j] = _mm256_fmadd_ps(wv[j], xv, acc[i][j]);
                    }
                }
                for (int i = 0; i < nr; i++)
                    for (int j = 0; j < no; j++) {
                        float s = hsum(acc[i][j]);
                        for (int k = I8; k < I; k++) s += wr[j][k] * xr[i][k];
                        y[b * ys + (size_t)(r0 + i) * O + o0 + j] = s;
                    }
            }
        }
    }
}

/* y[b] (R, D) = p[b] (R, S) @ v[b] (S, D): each output row sums p[r, s] * v[s] over s in
 * order, skipping exact zeros (masked slots: the same slots for a row alone or among others).
 * D a multiple of 8 and at most 256. */
void mix_f32(const float *p, const float *v, float *y, int nb, int R, int S, int D,
             long ps, long vs, long ys) {
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < nb; b++) {
        for (int r = 0; r < R; r++) {
            const float *pr = p + b * ps + (size_t)r * S, *vb = v + b * vs;
            __m256 acc[32];
            const int n8 = D / 8;
            for (int j = 0; j < n8; j++) acc[j] = _mm256_setzero_ps();
            for (int s = 0; s < S; s++) {
                if (pr[s] == 0.0f) continue;
                const __m256 pv = _mm256_set1_ps(pr[s]);
                for (int j = 0; j < n8; j++)
                    acc[j] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vb + (size_t)s * D + 8 * j), acc[j]);
            }
            for (int j = 0; j < n8; j++) _mm256_storeu_ps(y + b * ys + (size_t)r * D + 8 * j, acc[j]);
        }
    }
}
