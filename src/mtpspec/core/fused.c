/* A whole bf16 decoder forward of a Llama-style model in one call, for x86-64 CPUs with
 * AVX-512 BF16 (see fused.py for which models and why).
 *
 * Letters: T new rows, D hidden, H query heads, Hk key/value heads, hd head dim, M MLP width,
 * V vocabulary, S cache slots, N layers.
 *
 * Row invariance by construction: every value a row computes depends on that row's inputs and
 * on the cache slots it attends, never on which other rows are in the call or how the work is
 * split between threads. A matmul output is one fixed chain of AMX tile steps (or, where AMX
 * is absent or the shape does not fit its tiles, of dpbf16 steps reduced by one fixed shuffle
 * tree) over the input in 32-element steps; an attention row visits its slots in one fixed
 * order (the committed slots in slot order, then its own ancestors in depth order); every
 * elementwise function runs the same vector instructions on every element. So a verify pass
 * over k + 1 rows gives, bit for bit, the rows of k + 1 one-row passes, and a tree row that
 * attends its ancestors where they lie gives what plain decoding of its path would.
 *
 * Rounding follows a bf16 model run in torch (every rounding to bf16 is VCVTNEPS2BF16, to
 * nearest even): each matmul sums in fp32 and rounds to bf16,
 * a bias is added after that, norms and the softmax compute in fp32, every elementwise
 * product and sum rounds to bf16 (RoPE, SiLU, the gate product, the residual adds).
 *
 * One OpenMP parallel region per forward; each parallel loop is a `omp for` with its barrier.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef uint16_t bf16;

static inline __mmask16 m16(int n) { return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }
static inline __mmask32 m32(int n) { return n >= 32 ? (__mmask32)0xffffffffu : n <= 0 ? 0 : (__mmask32)((1u << n) - 1); }
static inline __m512 ld16(const bf16 *p, int n) { /* up to 16 bf16 widened exactly to fp32 */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m16(n), p)), 16));
}

static inline __m512 ldf(const float *p, int n) { return _mm512_maskz_loadu_ps(m16(n), p); }
/* fp32 lanes rounded to bf16, to nearest even (VCVTNEPS2BF16), stored, or widened back */
static inline void st16(bf16 *p, __m512 v, int n) { _mm256_mask_storeu_epi16(p, m16(n), (__m256i)_mm512_cvtneps_pbh(v)); }
static inline __m512 rb16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}
/* bf16(y) (+ bias, rounded again), as a bf16 matmul's output with its bias */
static inline __m512 biased(const float *y, const bf16 *b, int n) {
    const __m512 v = rb16(ldf(y, n));
    return b ? rb16(_mm512_add_ps(v, ld16(b, n))) : v;
}

/* exp(x) for 16 lanes: range reduction by ln 2 (two parts), a degree-6 polynomial, scaled by
 * 2^n. Pure vertical arithmetic: an element's result never depends on its lane. */
static inline __m512 vexp(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* y[r0 + i][o0 + j] = x row i . w row j for NR rows and no <= 4 outputs: one dpbf16 chain each. */
static inline __attribute__((always_inline)) void dot_block(const bf16 *const *xr, const bf16 *const *wr, int I,
                                                             float *y, int O, int r0, int o0, int no, const int NR) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < I; k += 32) {
        const __mmask32 m = m32(I - k);
        __m512i wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) wv[j] = _mm512_maskz_loadu_epi16(m, wr[j] + k);
#pragma GCC unroll 4
        for (int i = 0; i < NR; i++) {
            const __m512i xv = _mm512_maskz_loadu_epi16(m, xr[i] + k);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)wv[j], (__m512bh)xv);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NR; i++) {
        float out[4]; /* all four reduced with constant indices: acc stays in registers */
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) out[j] = _mm512_reduce_add_ps(acc[i][j]);
        for (int j = 0; j < no; j++) y[(size_t)(r0 + i) * O + o0 + j] = out[j];
    }
}

/* AVX-512 BF16: four weight rows stream side by side, each loaded vector serves up to four rows. */
static void matmul_dp(const bf16 *x, int R, int I, const bf16 *w, int O, float *y) {
    const int blocks = (O + 3) / 4;
#pragma omp for schedule(static)
    for (int ob = 0; ob < blocks; ob++) {
        const int o0 = ob * 4, no = O - o0 < 4 ? O - o0 : 4;
        const bf16 *wr[4];
        for (int j = 0; j < 4; j++) wr[j] = w + (size_t)(o0 + (j < no ? j : 0)) * I;
        for (int r0 = 0; r0 < R; r0 += 4) {
            const bf16 *xr[4];
            for (int i = 0; i < 4; i++) xr[i] = x + (size_t)(r0 + (r0 + i < R ? i : 0)) * I;
            switch (R - r0 < 4 ? R - r0 : 4) {
                case 1: dot_block(xr, wr, I, y, O, r0, o0, no, 1); break;
                case 2: dot_block(xr, wr, I, y, O, r0, o0, no, 2); break;
                case 3: dot_block(xr, wr, I, y, O, r0, o0, no, 3); break;
                default: dot_block(xr, wr, I, y, O, r0, o0, no, 4); break;
            }
        }
    }
}


/* AMX: y^T = w x^T, tiles of 16 outputs x N rows (N = R, or 16 column blocks beyond 16 rows),
 * four tiles (64 outputs) per block. Each output element is the same sequence of
 * TDPBF16PS steps over k whatever N is: row-invariant like the kernel above, and the hardware
 * reads each weight once for up to 16 rows at near one-row cost. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

static int use_amx = 0; /* set once by fused_init: the same kernel for every call of a process */

/* xv: scratch of (ceil(R / 16) * 16) * I bf16, shared by the threads */
static void matmul_amx(const bf16 *x, int R, int I, const bf16 *w, int O, float *y, bf16 *xv) {
    const int N = R < 16 ? R : 16, ncb = (R + 15) / 16, K2 = I / 2;
#pragma omp for schedule(static)
    for (int cb = 0; cb < ncb; cb++) /* x^T in pairs along k (the VNNI layout): [cb][k / 2][n][2] */
        for (int k2 = 0; k2 < K2; k2++)
            for (int n = 0; n < N; n++) {
                const int r = cb * 16 + n;
                bf16 *d = xv + (((size_t)cb * K2 + k2) * N + n) * 2;
                d[0] = r < R ? x[(size_t)r * I + 2 * k2] : 0;
                d[1] = r < R ? x[(size_t)r * I + 2 * k2 + 1] : 0;
            }
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 7; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = t == 4 || t == 5 ? 64 : N * 4; /* 0-3: y tiles, 4-5: w tiles, 6: x tile */
    }
    _tile_loadconfig(&cfg);
    const int blocks = (O + 63) / 64;
    const long ws = (long)I * 2;
#pragma omp for schedule(static)
    for (int ob = 0; ob < blocks; ob++) {
        const int o0 = ob * 64, nt = O - o0 >= 64 ? 4 : (O - o0) / 16;
        const bf16 *w0 = w + (size_t)o0 * I;
        for (int cb = 0; cb < ncb; cb++) {
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int k = 0; k < I; k += 32) {
                _tile_loadd(6, xv + ((size_t)cb * K2 + k / 2) * N * 2, N * 4);
                _tile_loadd(4, w0 + k, ws);
                _tile_dpbf16ps(0, 4, 6);
                if (nt > 1) { _tile_loadd(5, w0 + (size_t)16 * I + k, ws); _tile_dpbf16ps(1, 5, 6); }
                if (nt > 2) { _tile_loadd(4, w0 + (size_t)32 * I + k, ws); _tile_dpbf16ps(2, 4, 6); }
                if (nt > 3) { _tile_loadd(5, w0 + (size_t)48 * I + k, ws); _tile_dpbf16ps(3, 5, 6); }
            }
            float c[4][16 * 16];
            _tile_stored(0, c[0], N * 4);
            if (nt > 1) _tile_stored(1, c[1], N * 4);
            if (nt > 2) _tile_stored(2, c[2], N * 4);
            if (nt > 3) _tile_stored(3, c[3], N * 4);
            for (int t = 0; t < nt; t++)
                for (int n = 0; n < N && cb * 16 + n < R; n++)
                    for (int i = 0; i < 16; i++) y[(size_t)(cb * 16 + n) * O + o0 + 16 * t + i] = c[t][i * N + n];
        }
    }
    _tile_release();
}

/* Called inside a parallel region: the output blocks are shared out between the threads. Which
 * kernel runs depends on the shape and the process only, never on R. */
static void matmul(const bf16 *x, int R, int I, const bf16 *w, int O, float *y, bf16 *xv) {
    if (use_amx && I % 32 == 0 && O % 16 == 0)
        matmul_amx(x, R, I, w, O, y, xv);
    else
        matmul_dp(x, R, I, w, O, y);
}

/* Ask the kernel for the AMX tile state (Linux: ARCH_REQ_XCOMP_PERM); amx = 0 keeps to AVX-512.
 * Returns whether AMX is in use. Call once, before any forward. */
int fused_init(int amx) {
    use_amx = amx && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return use_amx;
}

/* out (R, D) = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))), per row (as w * F.rms_norm(x)). */
static void rms_norm(const bf16 *x, int R, int D, const bf16 *w, float eps, bf16 *out) {
#pragma omp for schedule(static)
    for (int r = 0; r < R; r++) {
        const bf16 *xr = x + (size_t)r * D;
        __m512 acc = _mm512_setzero_ps();
        for (int d = 0; d < D; d += 16) {
            const __m512 v = ld16(xr + d, D - d);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        const float inv = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)D + eps);
        const __m512 vinv = _mm512_set1_ps(inv);
        for (int d = 0; d < D; d += 16)
            st16(out + (size_t)r * D + d, _mm512_mul_ps(ld16(w + d, D - d), rb16(_mm512_mul_ps(ld16(xr + d, D - d), vinv))), D - d);
    }
}

/* x (R, D) = bf16(x + bf16(y) (+ bias)): a residual add of a matmul's fp32 output */
static void residual(bf16 *x, const float *y, const bf16 *b, int R, int D) {
#pragma omp for schedule(static)
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d += 16) {
            bf16 *xr = x + (size_t)r * D + d;
            st16(xr, _mm512_add_ps(ld16(xr, D - d), biased(y + (size_t)r * D + d, b ? b + d : NULL, D - d)), D - d);
        }
}

/* One head of a q/k/v projection's fp32 output: bf16 (+ bias), then RoPE where cos is given:
 * bf16(bf16(v * cos) + bf16(rotate_half(v) * signed sin)), as apply_rope_signed rounds. */
static void project_head(const float *yr, const bf16 *b, int hd, const bf16 *cos, const bf16 *sin, bf16 *dst) {
    float v[256], rot[256];
    const int half = hd / 2;
    for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(v + d, biased(yr + d, b ? b + d : NULL, hd - d));
    if (!cos) {
        for (int d = 0; d < hd; d += 16) st16(dst + d, ldf(v + d, hd - d), hd - d);
        return;
    }
    memcpy(rot, v + half, sizeof(float) * half);
    memcpy(rot + half, v, sizeof(float) * half);
    for (int d = 0; d < hd; d += 16)
        st16(dst + d, _mm512_add_ps(rb16(_mm512_mul_ps(ldf(v + d, hd - d), ld16(cos + d, hd - d))),
                                    rb16(_mm512_mul_ps(ldf(rot + d, hd - d), ld16(sin + d, hd - d)))), hd - d);
}

/* g (R, M) = bf16(bf16(silu(gate)) * up) from a gate/up matmul's fp32 output y (R, 2M) (+ bias) */
static void swiglu(const float *y, const bf16 *bg, int R, int M, bf16 *g) {
#pragma omp for schedule(static)
    for (int r = 0; r < R; r++)
        for (int j = 0; j < M; j += 16) {
            const float *yr = y + (size_t)r * 2 * M;
            const __m512 gt = biased(yr + j, bg ? bg + j : NULL, M - j), up = biased(yr + M + j, bg ? bg + M + j : NULL, M - j);
            const __m512 e = vexp(_mm512_sub_ps(_mm512_setzero_ps(), gt));
            st16(g + (size_t)r * M + j, _mm512_mul_ps(rb16(_mm512_div_ps(gt, _mm512_add_ps(_mm512_set1_ps(1.0f), e))), up), M - j);
        }
}

typedef struct {
    int n_layers, D, H, Hk, hd, M, V, S;
    /* per layer: weights (bf16, row-major (out, in)), biases (NULL = none), norm weights */
    const bf16 **attn_norm, **mlp_norm, **wqkv, **bqkv, **wo, **bo, **wgu, **bgu, **wdown, **bdown;
    const float *attn_eps, *mlp_eps, *scale;
    const int *rope;   /* 1: RoPE in this layer, 0: none (SmolLM3's NoPE layers) */
    const int *window; /* sliding window width, 0 = full attention */
    const bf16 *final_norm;
    float final_eps;
    const bf16 *lm_w, *lm_b;
    bf16 *keys, *values; /* (N, Hk, S, hd): RoPE'd keys and values, one slot per position */
} Model;

/* orow (hd) = bf16(sum over the n slots, in order, of (s[i] * inv) * v[slot i]); NV >= hd / 16 */
static inline __attribute__((always_inline)) void value_sum(const float *s, float inv, int n, int n_old, int start,
                                                             const int *anc_r, const bf16 *vh, int hd, bf16 *orow, const int NV) {
    __m512 o[16];
    for (int j = 0; j < NV; j++) o[j] = _mm512_setzero_ps();
    for (int i = 0; i < n; i++) {
        const float pi = s[i] * inv;
        if (pi == 0.0f) continue;
        const int sl = i < n_old ? i : start + (anc_r ? anc_r[i - n_old] : i - n_old);
        const bf16 *vr = vh + (size_t)sl * hd;
        const __m512 pv = _mm512_set1_ps(pi);
        for (int j = 0; j < NV; j++) o[j] = _mm512_fmadd_ps(pv, ld16(vr + 16 * j, hd - 16 * j), o[j]);
    }
    for (int j = 0; j < NV && 16 * j < hd; j++) st16(orow + 16 * j, o[j], hd - 16 * j);
}

/* Attention of rows [0, T) over their slots: committed slots 0..start-1 in order, then
 * start + anc[r * T + a] for a < nanc[r] (its ancestors and itself, in depth order).
 * K, Vv (Hk, S, hd): one layer of the cache. q (T, H, hd) bf16, out (T, H * hd) bf16.
 * win > 0: only positions > pos[r] - win are visible. */
static void attend(const bf16 *K, const bf16 *Vv, int S, int H, int Hk, int hd, float scale, int win,
                   int T, int start, const int *pos, const int *nanc, const int *anc,
                   const bf16 *q, bf16 *out, float *scratch) {
    const int g = H / Hk;
#pragma omp for schedule(static) collapse(2)
    for (int r = 0; r < T; r++) {
        for (int h = 0; h < H; h++) {
            float *s = scratch + (size_t)omp_get_thread_num() * (S + 16);
            const bf16 *kh = K + (size_t)(h / g) * S * hd, *vh = Vv + (size_t)(h / g) * S * hd;
            const bf16 *qh = q + ((size_t)r * H + h) * hd;
            const int lo = win > 0 && pos[r] - win + 1 > 0 ? pos[r] - win + 1 : 0; /* first visible position */
            const int n_old = start, n = n_old + (anc ? nanc[r] : r + 1);
            /* scores, fp32, one dpbf16 chain per slot; masked slots get -inf */
            for (int i = 0; i < n; i++) {
                const int a = i < n_old ? 0 : anc ? anc[r * T + (i - n_old)] : i - n_old; /* the new row there */
                const int sl = i < n_old ? i : start + a, p = i < n_old ? i : pos[a];
                if (p < lo) { s[i] = -INFINITY; continue; }
                const bf16 *kr = kh + (size_t)sl * hd;
                __m512 acc = _mm512_setzero_ps();
                for (int d = 0; d < hd; d += 32) {
                    const __mmask32 mk = m32(hd - d);
                    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_epi16(mk, kr + d),
                                           (__m512bh)_mm512_maskz_loadu_epi16(mk, qh + d));
                }
                s[i] = _mm512_reduce_add_ps(acc) * scale;
            }
            /* softmax over the n scores in 16-lane steps (the tail masked: -inf -> 0) */
            __m512 mx = _mm512_set1_ps(-INFINITY);
            for (int i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m16(n - i), s + i));
            const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
            __m512 sum = _mm512_setzero_ps();
            for (int i = 0; i < n; i += 16) {
                const __mmask16 mk = m16(n - i);
                const __m512 e = _mm512_maskz_mov_ps(mk, vexp(_mm512_sub_ps(_mm512_mask_loadu_ps(vmax, mk, s + i), vmax)));
                _mm512_mask_storeu_ps(s + i, mk, e);
                sum = _mm512_add_ps(sum, e);
            }
            const float inv = 1.0f / _mm512_reduce_add_ps(sum);
            /* the weighted value sum in slot order; hd <= 256 */
            const int nv = (hd + 15) / 16;
            bf16 *orow = out + (size_t)r * H * hd + (size_t)h * hd;
            switch (nv) { /* a constant register count: the sums stay in registers */
                case 4: value_sum(s, inv, n, n_old, start, anc ? anc + r * T : NULL, vh, hd, orow, 4); break;
                case 8: value_sum(s, inv, n, n_old, start, anc ? anc + r * T : NULL, vh, hd, orow, 8); break;
                default: value_sum(s, inv, n, n_old, start, anc ? anc + r * T : NULL, vh, hd, orow, 16); break;
            }
        }
    }
}

/* x (T, D) bf16: the embedded rows in, the final normed rows out.
 * pos (T,): positions; nanc (T,), anc (T, T): which new rows each row attends (see attend);
 * anc NULL: a chain (row r attends new rows 0..r).
 * cos, sin (T, hd) bf16: the rotary table at those positions, sin with its first half negated.
 * feat_layers (nfeat,): layer indices whose input rows to copy to feats (nfeat, T, D) in that
 * order (index N: the final normed rows). logits (Tk, V) fp32 for the last Tk rows. */
void fused_forward(const Model *m, bf16 *x, int T, int start, const int *pos, const int *nanc, const int *anc,
                   const bf16 *cos, const bf16 *sin, int nfeat, const int *feat_layers, bf16 *feats,
                   int Tk, float *logits, int nthreads) {
    const int D = m->D, H = m->H, Hk = m->Hk, hd = m->hd, M = m->M, S = m->S;
    const int Q = (H + 2 * Hk) * hd;
    const int wide = Q > 2 * M ? Q : 2 * M;
    float *y = malloc(sizeof(float) * (size_t)T * (wide > D ? wide : D));
    bf16 *h = malloc(sizeof(bf16) * (size_t)T * (D > H * hd ? D : H * hd));
    bf16 *qb = malloc(sizeof(bf16) * (size_t)T * H * hd);
    bf16 *ab = malloc(sizeof(bf16) * (size_t)T * H * hd);
    bf16 *gb = malloc(sizeof(bf16) * (size_t)T * M);
    float *scratch = malloc(sizeof(float) * (size_t)nthreads * (S + 16));
    const int widest_in = D > M ? (D > H * hd ? D : H * hd) : (M > H * hd ? M : H * hd);
    bf16 *xv = malloc(sizeof(bf16) * (size_t)((T + 15) / 16 * 16) * widest_in);
    float *ly = Tk > 0 ? malloc(sizeof(float) * (size_t)Tk * m->V) : NULL;
#pragma omp parallel num_threads(nthreads)
    {
        for (int l = 0; l < m->n_layers; l++) {
#pragma omp single
            for (int f = 0; f < nfeat; f++)
                if (feat_layers[f] == l) memcpy(feats + (size_t)f * T * D, x, sizeof(bf16) * (size_t)T * D);
            /* attention */
            rms_norm(x, T, D, m->attn_norm[l], m->attn_eps[l], h);
            matmul(h, T, D, m->wqkv[l], Q, y, xv);
            const bf16 *bq = m->bqkv[l];
            bf16 *Kl = m->keys + (size_t)l * Hk * S * hd, *Vl = m->values + (size_t)l * Hk * S * hd;
#pragma omp for schedule(static) collapse(2)
            for (int r = 0; r < T; r++) {
                for (int hh = 0; hh < H + 2 * Hk; hh++) { /* one head of q, k or v: bias, RoPE, its place */
                    bf16 *dst = hh < H ? qb + ((size_t)r * H + hh) * hd
                              : hh < H + Hk ? Kl + ((size_t)(hh - H) * S + start + r) * hd
                                            : Vl + ((size_t)(hh - H - Hk) * S + start + r) * hd;
                    project_head(y + (size_t)r * Q + (size_t)hh * hd, bq ? bq + hh * hd : NULL, hd,
                                 hh < H + Hk && m->rope[l] ? cos + (size_t)r * hd : NULL, sin + (size_t)r * hd, dst);
                }
            }
            attend(Kl, Vl, S, H, Hk, hd, m->scale[l], m->window[l], T, start, pos, nanc, anc, qb, ab, scratch);
            matmul(ab, T, H * hd, m->wo[l], D, y, xv);
            residual(x, y, m->bo[l], T, D);
            /* MLP */
            rms_norm(x, T, D, m->mlp_norm[l], m->mlp_eps[l], h);
            matmul(h, T, D, m->wgu[l], 2 * M, y, xv);
            swiglu(y, m->bgu[l], T, M, gb);
            matmul(gb, T, M, m->wdown[l], D, y, xv);
            residual(x, y, m->bdown[l], T, D);
        }
        rms_norm(x, T, D, m->final_norm, m->final_eps, h);
#pragma omp single
        {
            memcpy(x, h, sizeof(bf16) * (size_t)T * D);
            for (int f = 0; f < nfeat; f++)
                if (feat_layers[f] == m->n_layers) memcpy(feats + (size_t)f * T * D, x, sizeof(bf16) * (size_t)T * D);
        }
        if (Tk > 0) {
            matmul(x + (size_t)(T - Tk) * D, Tk, D, m->lm_w, m->V, ly, xv);
            const int V = m->V, chunks = (V + 15) / 16;
#pragma omp for schedule(static) collapse(2)
            for (int r = 0; r < Tk; r++)
                for (int c = 0; c < chunks; c++) /* bf16 logits (+ bias), kept as fp32 */
                    _mm512_mask_storeu_ps(logits + (size_t)r * V + 16 * c, m16(V - 16 * c),
                                          biased(ly + (size_t)r * V + 16 * c, m->lm_b ? m->lm_b + 16 * c : NULL, V - 16 * c));
        }
    }
    free(xv); free(y); free(h); free(qb); free(ab); free(gb); free(scratch); free(ly);
}

/* y (R, O) fp32 = x (R, I) @ w (O, I)^T: the forward's matmul alone (tests, measurements). */
void fused_matmul(const bf16 *x, int R, int I, const bf16 *w, int O, float *y, int nthreads) {
    bf16 *xv = malloc(sizeof(bf16) * (size_t)((R + 15) / 16 * 16) * I);
#pragma omp parallel num_threads(nthreads)
    matmul(x, R, I, w, O, y, xv);
    free(xv);
}

/* The MTP head (head.py) for one draft step of one row, as one call.
 * Letters: D hidden, H heads of hd (the target's), Hk the target's key/value heads, M the MLP
 * width per block (0: none), S cache slots, L of them committed, V1 + E vocabulary rows. */
typedef struct {
    int D, H, Hk, hd, M, n_blocks;
    float eps, final_eps;
    const bf16 *norm_state, *norm_embed, *fc, *final_norm; /* fc (D, 2D) */
    const bf16 **norm_attn, **wq, **wo, **norm_mlp, **wgu, **wdown; /* per block */
} Head;

/* R rows at one position (a chain's step: R = 1; a tree's frontier: its nodes).
 * state, emb (R, D): the states and the embedded tokens; cos, sin (hd) at the position (sin
 * signed as above); keys, values (Hk, S, hd): the target's layer the head reads, slots 0..L-1.
 * Out: state_out (R, D) and logits (R, V1 + E) fp32 (bf16 values) over w_vocab (V1, D) then
 * w_extra (E, D), from the target's final norm of the new states. */
void head_step(const Head *h, int R, const bf16 *state, const bf16 *emb, const bf16 *cos, const bf16 *sin,
               const bf16 *keys, const bf16 *values, int S, int L, const bf16 *w_vocab, int V1,
               const bf16 *w_extra, int E, bf16 *state_out, float *logits, int nthreads) {
    const int D = h->D, H = h->H, hd = h->hd, M = h->M;
    int wide = 2 * D > 2 * M ? 2 * D : 2 * M;
    wide = wide > H * hd ? wide : H * hd;
    bf16 *u = malloc(sizeof(bf16) * (size_t)R * wide), *n2 = malloc(sizeof(bf16) * (size_t)R * 2 * D);
    bf16 *q = malloc(sizeof(bf16) * (size_t)R * H * hd), *a = malloc(sizeof(bf16) * (size_t)R * H * hd);
    float *y = malloc(sizeof(float) * (size_t)R * wide);
    float *l1 = malloc(sizeof(float) * (size_t)R * V1), *l2 = E > 0 ? malloc(sizeof(float) * (size_t)R * E) : NULL;
    bf16 *xv = malloc(sizeof(bf16) * (size_t)((R + 15) / 16 * 16) * wide);
    float *scratch = malloc(sizeof(float) * (size_t)nthreads * (S + 16));
    int *pos = malloc(sizeof(int) * R), *none = calloc(R, sizeof(int));
    for (int r = 0; r < R; r++) pos[r] = L;
    bf16 *x = state_out; /* written by the fc step first */
#pragma omp parallel num_threads(nthreads)
    {
        rms_norm(state, R, D, h->norm_state, h->eps, n2); /* u = [norm(state); norm(emb)] (R, 2D) */
        rms_norm(emb, R, D, h->norm_embed, h->eps, n2 + (size_t)R * D);
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            memcpy(u + (size_t)r * 2 * D, n2 + (size_t)r * D, sizeof(bf16) * D);
            memcpy(u + (size_t)r * 2 * D + D, n2 + (size_t)(R + r) * D, sizeof(bf16) * D);
        }
        matmul(u, R, 2 * D, h->fc, D, y, xv);
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++)
            for (int d = 0; d < D; d += 16) st16(x + (size_t)r * D + d, ldf(y + (size_t)r * D + d, D - d), D - d);
        for (int b = 0; b < h->n_blocks; b++) {
            rms_norm(x, R, D, h->norm_attn[b], h->eps, u);
            matmul(u, R, D, h->wq[b], H * hd, y, xv);
#pragma omp for schedule(static) collapse(2)
            for (int r = 0; r < R; r++)
                for (int hh = 0; hh < H; hh++)
                    project_head(y + ((size_t)r * H + hh) * hd, NULL, hd, cos, sin, q + ((size_t)r * H + hh) * hd);
            /* every committed slot, no new rows: each row at "start" L with no ancestors */
            attend(keys, values, S, H, h->Hk, hd, 1.0f / sqrtf((float)hd), 0, R, L, pos, none, none, q, a, scratch);
            matmul(a, R, H * hd, h->wo[b], D, y, xv);
            residual(x, y, NULL, R, D);
            if (M > 0) {
                rms_norm(x, R, D, h->norm_mlp[b], h->eps, u);
                matmul(u, R, D, h->wgu[b], 2 * M, y, xv);
                swiglu(y, NULL, R, M, u); /* u now holds the gate products (R, M) */
                matmul(u, R, M, h->wdown[b], D, y, xv);
                residual(x, y, NULL, R, D);
            }
        }
        rms_norm(x, R, D, h->final_norm, h->final_eps, u);
        matmul(u, R, D, w_vocab, V1, l1, xv);
        if (E > 0) matmul(u, R, D, w_extra, E, l2, xv);
        const int V = V1 + E;
#pragma omp for schedule(static) collapse(2)
        for (int r = 0; r < R; r++)
            for (int i = 0; i < V; i += 16) { /* both parts, rounded to bf16, side by side */
                float t[16];
                for (int j = 0; j < 16; j++) t[j] = i + j < V1 ? l1[(size_t)r * V1 + i + j] : i + j < V ? l2[(size_t)r * E + i + j - V1] : 0.0f;
                _mm512_mask_storeu_ps(logits + (size_t)r * V + i, m16(V - i), rb16(_mm512_loadu_ps(t)));
            }
    }
    free(u); free(n2); free(q); free(a); free(y); free(l1); free(l2); free(xv); free(scratch); free(pos); free(none);
}
