/* A whole decoder forward of a Llama-style model in one call, for x86-64 CPUs with AVX-512:
 * in bf16 (built as is: AVX-512 BF16, AMX where present) or in fp32 (built with -DFUSED_F32:
 * AVX-512F alone). See fused.py for which models and why.
 *
 * Letters: T new rows, D hidden, H query heads, Hk key/value heads, hd head dim, M MLP width,
 * V vocabulary, S cache slots, N layers. `elem` is the model's element type (bf16 or float).
 *
 * Row invariance by construction: every value a row computes depends on that row's inputs and
 * on the cache slots it attends, never on which other rows are in the call or how the work is
 * split between threads. A matmul output is one fixed chain of AMX tile steps (or, where AMX
 * is absent or the shape does not fit its tiles, of dpbf16 / fp32 FMA steps reduced by one
 * fixed shuffle tree) over the input in 32- (bf16) or 16-element (fp32) steps; an attention
 * row visits its slots in one fixed order (the committed slots in slot order, then its own
 * ancestors in depth order); every elementwise function runs the same vector instructions on
 * every element. So a verify pass over k + 1 rows gives, bit for bit, the rows of k + 1
 * one-row passes, and a tree row that attends its ancestors where they lie gives what plain
 * decoding of its path would.
 *
 * Rounding follows the model run in torch. bf16 (every rounding to bf16 is VCVTNEPS2BF16, to
 * nearest even): each matmul sums in fp32 and rounds to bf16,
 * a bias is added after that, norms and the softmax compute in fp32, every elementwise
 * product and sum rounds to bf16 (RoPE, SiLU, the gate product, the residual adds). fp32: the
 * same steps with no rounding in between (rb16 is the identity).
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
static inline __m512 ldf(const float *p, int n) { return _mm512_maskz_loadu_ps(m16(n), p); }

#ifdef FUSED_F32
typedef float elem;
/* up to 16 elements as fp32 lanes; stored; "rounded to the element type" (nothing to do) */
static inline __m512 ld16(const elem *p, int n) { return ldf(p, n); }
static inline void st16(elem *p, __m512 v, int n) { _mm512_mask_storeu_ps(p, m16(n), v); }
static inline __m512 rb16(__m512 v) { return v; }
/* a dot product's step: KSTEP elements of two operands loaded, multiplied into fp32 lanes */
#define KSTEP 16
typedef __m512 kvec;
static inline kvec ldk(const elem *p, int n) { return _mm512_maskz_loadu_ps(m16(n), p); }
static inline __m512 dotk(__m512 acc, kvec a, kvec b) { return _mm512_fmadd_ps(a, b, acc); }
#else
typedef bf16 elem;
static inline __m512 ld16(const bf16 *p, int n) { /* up to 16 bf16 widened exactly to fp32 */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m16(n), p)), 16));
}
/* fp32 lanes rounded to bf16, to nearest even (VCVTNEPS2BF16), stored, or widened back */
static inline void st16(bf16 *p, __m512 v, int n) { _mm256_mask_storeu_epi16(p, m16(n), (__m256i)_mm512_cvtneps_pbh(v)); }
static inline __m512 rb16(__m512 v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}
#define KSTEP 32
typedef __m512i kvec;
static inline kvec ldk(const elem *p, int n) { return _mm512_maskz_loadu_epi16(m32(n), p); }
static inline __m512 dotk(__m512 acc, kvec a, kvec b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }
#endif
/* elem(y) (+ bias, rounded again), as a matmul's output with its bias */
static inline __m512 biased(const float *y, const elem *b, int n) {
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

/* Quantized weights, by the rows of a pass (measured on SmolLM2's Q4_1 / Q8_0 matrices, AMD EPYC Zen 4,
 * 2 cores, one sequence at 100 positions): up to NRMAX rows four weight rows at a time (qdot_block;
 * 5 and 6 rows 7.9 and 8.5 ms a forward, against 8.3 and 9.2 two at a time); 7..NRW rows two weight
 * rows at a time (qdot_wide: 8 rows 10.9 ms, 12 rows 15.0, against 14.0 and 16.5 dequantizing into
 * wb); more rows dequantize each block of weight rows once into wb and run dot_block over it. */
#define WIDE_ROWS_MIN NRMAX
#define NRMAX 6     /* rows per block: NRMAX x 4 accumulators + 4 weight vectors + 1 row vector <= 32 registers */
#define PF_BLOCKS 2 /* prefetch the weight rows this many blocks ahead, to L1 (measured: 1-8 blocks alike in bf16; in fp32
                     * 4 blocks to L2 sped 9 rows up but slowed one row, reports/fused/fused-v3) */

/* The first two levels of _mm512_reduce_add_ps's tree (lanes l + l+8, then + l+4) for a[0..3]
 * at once: 128-bit block b of the result holds a[b]'s four partial sums. */
static inline __attribute__((always_inline)) __m512 reduce_halves4(const __m512 *a) {
    const __m512 v0 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], 0x44), _mm512_shuffle_f32x4(a[0], a[1], 0xEE));
    const __m512 v1 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], 0x44), _mm512_shuffle_f32x4(a[2], a[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x88), _mm512_shuffle_f32x4(v0, v1, 0xDD));
}

/* The lane sums of a[0..3] into out[0..no-1], each by the tree of _mm512_reduce_add_ps (lanes
 * l + l+8, then + l+4, then + l+2, then + l+1), four at once: bit for bit four
 * _mm512_reduce_add_ps, in about half the instructions (reduce16 below does sixteen). */
static inline __attribute__((always_inline)) void reduce4(const __m512 *a, float *out, int no) {
    const __m512 w = reduce_halves4(a);
    const __m512 t = _mm512_add_ps(w, _mm512_permute_ps(w, _MM_SHUFFLE(1, 0, 3, 2))); /* l + l+2 */
    const __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1))); /* lane 4b: a[b]'s sum */
    _mm512_mask_storeu_ps(out, m16(no), _mm512_maskz_compress_ps(0x1111, u));
}

/* Weight matrices as the forward reads them: up to three parts stacked along the outputs (q, k, v;
 * gate, up), each dense (the element type, row-major) or a GGUF file's quantized blocks, each
 * row `row_bytes` long. Types are GGML's ids. */
enum { Q_DENSE = 0, Q_4_0 = 2, Q_4_1 = 3, Q_8_0 = 8, Q_4_K = 12, Q_5_K = 13, Q_6_K = 14 };
/* the same blocks regrouped for 8-bit activations (see matmul_q8), and their bytes per 16 outputs x 32 inputs */
enum { P_4_0 = 0x102, P_4_1 = 0x103, P_8_0 = 0x108 };
static inline int is_packed(int t) { return t == P_4_0 || t == P_4_1 || t == P_8_0; }
static inline int pblk(int t) { return t == P_4_0 ? 288 : t == P_4_1 ? 320 : 544; }
typedef struct {
    const void *data;
    int type, rows;
    long row_bytes;
} Part;
typedef struct {
    int nparts;
    Part part[3];
} Mat;

/* Block b of a matmul's blocks (nb[p] of them in part p, parts in order): its part, returned, with
 * the block's index in that part (*ob) and the part's first output (*o_part) */
static inline int block_part(const Mat *w, const int *nb, int b, int *ob, int *o_part) {
    int p = 0;
    *o_part = 0;
    while (b >= nb[p]) b -= nb[p], *o_part += w->part[p].rows, p++;
    *ob = b;
    return p;
}

static inline Mat dense_mat(const elem *w, int O, int I) {
    Mat m;
    memset(&m, 0, sizeof m);
    m.nparts = 1;
    m.part[0].data = w, m.part[0].type = Q_DENSE, m.part[0].rows = O, m.part[0].row_bytes = (long)I * sizeof(elem);
    return m;
}

/* fp32 products and sums that the compiler may not fuse into one FMA (the embedded rounding
 * makes them builtins, not vector arithmetic): each rounds as numpy's float32 step does */
#define MUL(a, b) _mm512_mul_round_ps((a), (b), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define ADD(a, b) _mm512_add_round_ps((a), (b), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define SUB(a, b) _mm512_sub_round_ps((a), (b), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline float f16(const uint8_t *p) { /* an fp16 scale, widened exactly */
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
static inline __m512i bytes16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
static inline __m512 fl(__m512i v) { return _mm512_cvtepi32_ps(v); }

/* Q4_K / Q5_K: sub-block j's 6-bit scale and min from the 12 packed bytes s */
static inline void scale_min_k4(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) *sc = s[j] & 63, *m = s[j + 4] & 63;
    else *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
}

/* The 32 weights of group g (inputs 32g .. 32g + 31) of one quantized row, as fp32 lanes lo
 * (the first 16) and hi: bit for bit the values gguf-py's `dequantize` gives (and transformers
 * loads), each product and sum rounded in the order numpy computes it. */
static inline __attribute__((always_inline)) void deq32(const uint8_t *row, const int qt, int g, __m512 *lo, __m512 *hi) {
    const __m512i f = _mm512_set1_epi32(15);
    switch (qt) {
        case Q_4_0: { /* d * (q - 8); q: the low nibbles, then the high */
            const uint8_t *b = row + (size_t)18 * g;
            const __m512 d = _mm512_set1_ps(f16(b));
            const __m512i v = bytes16(b + 2), e8 = _mm512_set1_epi32(8);
            *lo = MUL(d, fl(_mm512_sub_epi32(_mm512_and_si512(v, f), e8)));
            *hi = MUL(d, fl(_mm512_sub_epi32(_mm512_srli_epi32(v, 4), e8)));
            break;
        }
        case Q_4_1: { /* d * q + m */
            const uint8_t *b = row + (size_t)20 * g;
            const __m512 d = _mm512_set1_ps(f16(b)), m = _mm512_set1_ps(f16(b + 2));
            const __m512i v = bytes16(b + 4);
            *lo = ADD(MUL(d, fl(_mm512_and_si512(v, f))), m);
            *hi = ADD(MUL(d, fl(_mm512_srli_epi32(v, 4))), m);
            break;
        }
        case Q_8_0: { /* q * d */
            const uint8_t *b = row + (size_t)34 * g;
            const __m512 d = _mm512_set1_ps(f16(b));
            *lo = MUL(fl(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)))), d);
            *hi = MUL(fl(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)))), d);
            break;
        }
        case Q_4_K:
        case Q_5_K: { /* (d * sc) * q - dmin * m; Q5_K: q's fifth bit from qh */
            const int j = g & 7;
            const uint8_t *b = row + (size_t)(qt == Q_4_K ? 144 : 176) * (g >> 3);
            int sc, mn;
            scale_min_k4(b + 4, j, &sc, &mn);
            const __m512 ds = _mm512_set1_ps(f16(b) * (float)sc), dm = _mm512_set1_ps(f16(b + 2) * (float)mn);
            const uint8_t *qs = b + (qt == Q_4_K ? 16 : 48) + 32 * (j >> 1);
            const int sh = 4 * (j & 1);
            __m512i q0 = _mm512_and_si512(_mm512_srli_epi32(bytes16(qs), sh), f);
            __m512i q1 = _mm512_and_si512(_mm512_srli_epi32(bytes16(qs + 16), sh), f);
            if (qt == Q_5_K) {
                const __m512i one = _mm512_set1_epi32(1);
                q0 = _mm512_or_si512(q0, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(bytes16(b + 16), j), one), 4));
                q1 = _mm512_or_si512(q1, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(bytes16(b + 32), j), one), 4));
            }
            *lo = SUB(MUL(ds, fl(q0)), dm);
            *hi = SUB(MUL(ds, fl(q1)), dm);
            break;
        }
        default: { /* Q6_K: (d * sc) * (q - 32), one int8 scale per 16 weights */
            const uint8_t *b = row + (size_t)210 * (g >> 3);
            const int j = g & 7, h = j >> 2;
            const float d = f16(b + 208);
            const int8_t *sc = (const int8_t *)(b + 192) + 2 * j;
            const uint8_t *ql = b + 64 * h + 32 * (j & 1), *qh = b + 128 + 32 * h;
            const int shl = 4 * ((j & 3) >> 1), shh = 2 * (j & 3);
            const __m512i three = _mm512_set1_epi32(3), e32 = _mm512_set1_epi32(32);
            const __m512i q0 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(bytes16(ql), shl), f),
                                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(bytes16(qh), shh), three), 4));
            const __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(bytes16(ql + 16), shl), f),
                                               _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(bytes16(qh + 16), shh), three), 4));
            *lo = MUL(_mm512_set1_ps(d * (float)sc[0]), fl(_mm512_sub_epi32(q0, e32)));
            *hi = MUL(_mm512_set1_ps(d * (float)sc[1]), fl(_mm512_sub_epi32(q1, e32)));
            break;
        }
    }
}

/* Q4_0 / Q4_1 through a table: a block's 32 weights take at most 16 values (one per nibble), so
 * the 16 are computed once (d * n + m; d * (n - 8)) and each weight is looked up by its
 * nibble: the same values as deq32's per-weight arithmetic (the same steps on the same
 * operands; d * n is exact, 11 by 4 significant bits, so one FMA rounds as mul then add does),
 * in a third of the vector work. lut: the 16 values as fp32 lanes; lo/hi: nibble indices of
 * inputs 0-15 / 16-31 (fp32) or idx: all 32 as 16-bit lanes (bf16). */
static inline __m512 lut4(const uint8_t *b, const int qt) {
    const __m512 n = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int32_t dm; /* d, and m after it (Q4_1): both fp16 scales widened by one conversion */
    memcpy(&dm, b, 4);
    const __m128 s = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
    const __m512 d = _mm512_broadcastss_ps(s);
    if (qt == Q_4_1) return _mm512_fmadd_ps(d, n, _mm512_broadcastss_ps(_mm_movehdup_ps(s)));
    return MUL(d, _mm512_sub_ps(n, _mm512_set1_ps(8.0f)));
}
#ifndef FUSED_F32
/* idx lanes 0-15: the 16 bytes whole (vpermw reads index bits 0-4, so bit 4, the high nibble's
 * low bit, must not matter: the table holds the 16 values twice); lanes 16-31: the bytes >> 4. */
static inline __attribute__((always_inline)) kvec deq32_bf16(const uint8_t *row, const int qt, int g) {
    if (qt == Q_4_0 || qt == Q_4_1) {
        const uint8_t *b = row + (size_t)(qt == Q_4_1 ? 20 : 18) * g;
        const __m256i q = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + (qt == Q_4_1 ? 4 : 2))));
        const __m512i idx = _mm512_srlv_epi16(_mm512_cvtepu8_epi16(q), _mm512_set_epi64(
            0x0004000400040004LL, 0x0004000400040004LL, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0, 0, 0));
        const __m512 l = lut4(b, qt);
        return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(l, l));
    }
    __m512 lo, hi;
    deq32(row, qt, g, &lo, &hi);
    return (kvec)_mm512_cvtne2ps_pbh(hi, lo); /* 32 bf16 in input order */
}
#else
static inline __attribute__((always_inline)) void deq32_f32(const uint8_t *row, const int qt, int g, __m512 *lo, __m512 *hi) {
    if (qt == Q_4_0 || qt == Q_4_1) {
        const uint8_t *b = row + (size_t)(qt == Q_4_1 ? 20 : 18) * g;
        const __m512i v = bytes16(b + (qt == Q_4_1 ? 4 : 2));
        const __m512 lut = lut4(b, qt); /* vpermps reads index bits 0-3 only: the low nibble as is */
        *lo = _mm512_permutexvar_ps(v, lut);
        *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), lut);
        return;
    }
    deq32(row, qt, g, lo, hi);
}
#endif

/* dot_block for quantized weight rows: the same chains, each weight vector dequantized in
 * registers to its exact value (rounded to bf16 where the compute is bf16) right before use.
 * wr: 4 rows of `qt` blocks; I % 32 == 0. */
static inline __attribute__((always_inline)) void qdot_block(const elem *const *xr, const uint8_t *const *wr, long rb, int I,
                                                              float *y, int O, int r0, int o0, int no, const int NR, const int qt) {
    __m512 acc[NRMAX][4];
#pragma GCC unroll 6
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    const int G = I / 32;
    const long pf = (long)PF_BLOCKS * 4 * rb, gb = rb / G; /* prefetch distance; bytes per group, on average */
    for (int g = 0; g < G; g++) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) _mm_prefetch((const char *)(wr[j] + pf + g * gb), _MM_HINT_T1);
#ifdef FUSED_F32
        __m512 lo[4], hi[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) deq32_f32(wr[j], qt, g, &lo[j], &hi[j]);
#pragma GCC unroll 6
        for (int i = 0; i < NR; i++) { /* the dense chain's two 16-element steps */
            const __m512 x0 = ldf(xr[i] + 32 * g, 16), x1 = ldf(xr[i] + 32 * g + 16, 16);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_fmadd_ps(hi[j], x1, _mm512_fmadd_ps(lo[j], x0, acc[i][j]));
        }
#else
        kvec wv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) wv[j] = deq32_bf16(wr[j], qt, g);
#pragma GCC unroll 6
        for (int i = 0; i < NR; i++) {
            const kvec xv = ldk(xr[i] + 32 * g, 32);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[i][j] = dotk(acc[i][j], wv[j], xv);
        }
#endif
    }
#pragma GCC unroll 6
    for (int i = 0; i < NR; i++) reduce4(acc[i], y + (size_t)(r0 + i) * O + o0, no);
}

/* qdot_block for up to NRW rows against 2 weight rows (NRW x 2 accumulators + 2 weight vectors + 1
 * row vector <= 32 registers): each dequantized weight vector serves twice as many rows. Every
 * output is the same chain as in qdot_block (and dot_block over the dequantized rows), reduced by
 * the same tree (reduce4), so which kernel runs never changes a value. */
#define NRW 12
static inline __attribute__((always_inline)) void qdot_wide(const elem *const *xr, const uint8_t *const *wr, long rb, int I,
                                                             float *y, int O, int r0, int o0, int no, const int NR, const int qt) {
    __m512 acc[NRW][2];
#pragma GCC unroll 12
    for (int i = 0; i < NR; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const int G = I / 32;
    const long pf = (long)PF_BLOCKS * 4 * rb, gb = rb / G;
    for (int g = 0; g < G; g++) {
        _mm_prefetch((const char *)(wr[0] + pf + g * gb), _MM_HINT_T1);
        _mm_prefetch((const char *)(wr[1] + pf + g * gb), _MM_HINT_T1);
#ifdef FUSED_F32
        __m512 lo[2], hi[2];
        deq32_f32(wr[0], qt, g, &lo[0], &hi[0]);
        deq32_f32(wr[1], qt, g, &lo[1], &hi[1]);
#pragma GCC unroll 12
        for (int i = 0; i < NR; i++) {
            const __m512 x0 = ldf(xr[i] + 32 * g, 16), x1 = ldf(xr[i] + 32 * g + 16, 16);
            acc[i][0] = _mm512_fmadd_ps(hi[0], x1, _mm512_fmadd_ps(lo[0], x0, acc[i][0]));
            acc[i][1] = _mm512_fmadd_ps(hi[1], x1, _mm512_fmadd_ps(lo[1], x0, acc[i][1]));
        }
#else
        const kvec w0 = deq32_bf16(wr[0], qt, g), w1 = deq32_bf16(wr[1], qt, g);
#pragma GCC unroll 12
        for (int i = 0; i < NR; i++) {
            const kvec xv = ldk(xr[i] + 32 * g, 32);
            acc[i][0] = dotk(acc[i][0], w0, xv);
            acc[i][1] = dotk(acc[i][1], w1, xv);
        }
#endif
    }
#pragma GCC unroll 12
    for (int i = 0; i < NR; i++) {
        const __m512 a[4] = {acc[i][0], acc[i][1], _mm512_setzero_ps(), _mm512_setzero_ps()};
        reduce4(a, y + (size_t)(r0 + i) * O + o0, no);
    }
}

/* one KSTEP of dot_block: n < KSTEP only at the tail, so the main loop's masks are constants */
#define DOT_STEP(k, n)                                                                                 \
    do {                                                                                               \
        kvec wv[4];                                                                                    \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) wv[j] = ldk(wr[j] + (k), (n));            \
        if (PF) _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                                   \
            _mm_prefetch((const char *)(wr[j] + (size_t)PF_BLOCKS * 4 * I + (k)), _MM_HINT_T1);        \
        _Pragma("GCC unroll 6") for (int i = 0; i < NR; i++) {                                        \
            const kvec xv = ldk(xr[i] + (k), (n));                                                     \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) acc[i][j] = dotk(acc[i][j], wv[j], xv); \
        }                                                                                              \
    } while (0)

/* y[r0 + i][o0 + j] = x row i . w row j for NR rows and no <= 4 outputs: one dpbf16 (fp32: FMA) chain each. */
static inline __attribute__((always_inline)) void dot_block(const elem *const *xr, const elem *const *wr, int I,
                                                             float *y, int O, int r0, int o0, int no, const int NR, const int PF) {
    __m512 acc[NRMAX][4];
#pragma GCC unroll 6
    for (int i = 0; i < NR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
    int k = 0;
    for (; k + KSTEP <= I; k += KSTEP) DOT_STEP(k, KSTEP);
    if (k < I) DOT_STEP(k, I - k);
#pragma GCC unroll 6
    for (int i = 0; i < NR; i++) reduce4(acc[i], y + (size_t)(r0 + i) * O + o0, no);
}
#undef DOT_STEP

/* AVX-512 (BF16): four weight rows stream side by side, each loaded vector serves up to four
 * rows; a block's weights are read from memory once and from cache for each further four rows.
 * The blocks of every part of w are shared out together; a quantized part's rows are
 * dequantized in registers (qdot_block). */
#define NR_SWITCH(CALL)                                   \
    switch (R - r0 < NRMAX ? R - r0 : NRMAX) {            \
        case 1: CALL(1); break;                           \
        case 2: CALL(2); break;                           \
        case 3: CALL(3); break;                           \
        case 4: CALL(4); break;                           \
        case 5: CALL(5); break;                           \
        default: CALL(6); break;                          \
    }
#define NRW_SWITCH(CALL)                                  \
    switch (R - r0 < NRW ? R - r0 : NRW) {                \
        case 1: CALL(1); break;                           \
        case 2: CALL(2); break;                           \
        case 3: CALL(3); break;                           \
        case 4: CALL(4); break;                           \
        case 5: CALL(5); break;                           \
        case 6: CALL(6); break;                           \
        case 7: CALL(7); break;                           \
        case 8: CALL(8); break;                           \
        case 9: CALL(9); break;                           \
        case 10: CALL(10); break;                         \
        case 11: CALL(11); break;                         \
        default: CALL(12); break;                         \
    }
/* A quantized block's 4 rows dequantized into wb (4, I) in the element type: for a pass of more
 * than NRMAX rows, whose row chunks would each dequantize them again. dot_block over wb runs
 * qdot_block's chains on the same values, so the outputs do not depend on the path. */
static inline __attribute__((always_inline)) void dequant_block_t(const uint8_t *const *wr, const int qt, int I, elem *wb) {
    for (int j = 0; j < 4; j++)
        for (int g = 0; g < I / 32; g++) {
#ifdef FUSED_F32
            __m512 lo, hi;
            deq32_f32(wr[j], qt, g, &lo, &hi);
            _mm512_storeu_ps(wb + (size_t)j * I + 32 * g, lo);
            _mm512_storeu_ps(wb + (size_t)j * I + 32 * g + 16, hi);
#else
            _mm512_storeu_si512(wb + (size_t)j * I + 32 * g, deq32_bf16(wr[j], qt, g));
#endif
        }
}

static void dequant_block(const uint8_t *const *wr, const int qt, int I, elem *wb) {
    switch (qt) { /* each type's loop compiled with its constant */
        case Q_4_0: dequant_block_t(wr, Q_4_0, I, wb); break;
        case Q_4_1: dequant_block_t(wr, Q_4_1, I, wb); break;
        case Q_8_0: dequant_block_t(wr, Q_8_0, I, wb); break;
        case Q_4_K: dequant_block_t(wr, Q_4_K, I, wb); break;
        case Q_5_K: dequant_block_t(wr, Q_5_K, I, wb); break;
        default: dequant_block_t(wr, Q_6_K, I, wb); break;
    }
}

/* the parts of w in `which` (a bit per part; y's columns of the others are left as they are) */
static void matmul_dp(const elem *x, int R, int I, const Mat *w, int O, float *y, int which) {
    int nb[3] = {0, 0, 0}, blocks = 0, quantized = 0;
    for (int p = 0; p < w->nparts; p++)
        if (which >> p & 1) blocks += nb[p] = (w->part[p].rows + 3) / 4, quantized |= w->part[p].type != Q_DENSE;
    /* this thread's block of dequantized rows, for passes of more than NRMAX rows */
    elem *wb = quantized && R > NRW ? malloc(sizeof(elem) * 4 * (size_t)I) : NULL;
#pragma omp for schedule(static)
    for (int b = 0; b < blocks; b++) {
        int ob, o_part; /* the block's index in its part, the part's first output */
        const Part *P = &w->part[block_part(w, nb, b, &ob, &o_part)];
        const int o0 = ob * 4, no = P->rows - o0 < 4 ? P->rows - o0 : 4, qt = P->type;
        const uint8_t *wr[4];
        for (int j = 0; j < 4; j++) wr[j] = (const uint8_t *)P->data + (size_t)(o0 + (j < no ? j : 0)) * P->row_bytes;
        if (qt != Q_DENSE && R > WIDE_ROWS_MIN && !wb) { /* rows in chunks of NRW, weight rows in pairs */
            for (int r0 = 0; r0 < R; r0 += NRW) {
                const elem *xr[NRW];
                for (int i = 0; i < NRW; i++) xr[i] = x + (size_t)(r0 + (r0 + i < R ? i : 0)) * I;
                for (int j0 = 0; j0 < no; j0 += 2) {
                    const uint8_t *w2[2] = {wr[j0], wr[j0 + 1 < no ? j0 + 1 : j0]};
                    const int n2 = no - j0 < 2 ? no - j0 : 2;
#define WIDE(nr, t) qdot_wide(xr, w2, P->row_bytes, I, y, O, r0, o_part + o0 + j0, n2, nr, t)
#define W40(nr) WIDE(nr, Q_4_0)
#define W41(nr) WIDE(nr, Q_4_1)
#define W80(nr) WIDE(nr, Q_8_0)
#define W4K(nr) WIDE(nr, Q_4_K)
#define W5K(nr) WIDE(nr, Q_5_K)
#define W6K(nr) WIDE(nr, Q_6_K)
                    switch (qt) {
                        case Q_4_0: NRW_SWITCH(W40); break;
                        case Q_4_1: NRW_SWITCH(W41); break;
                        case Q_8_0: NRW_SWITCH(W80); break;
                        case Q_4_K: NRW_SWITCH(W4K); break;
                        case Q_5_K: NRW_SWITCH(W5K); break;
                        default: NRW_SWITCH(W6K); break;
                    }
#undef WIDE
#undef W40
#undef W41
#undef W80
#undef W4K
#undef W5K
#undef W6K
                }
            }
            continue;
        }
        const elem *wd[4];
        int qt_run = qt; /* the kernel this block runs: quantized, or dense over wb */
        if (wb && qt != Q_DENSE) {
            dequant_block(wr, qt, I, wb);
            for (int j = 0; j < 4; j++) wd[j] = wb + (size_t)j * I;
            qt_run = Q_DENSE;
        } else
            for (int j = 0; j < 4; j++) wd[j] = (const elem *)wr[j];
        for (int r0 = 0; r0 < R; r0 += NRMAX) {
            const elem *xr[NRMAX];
            for (int i = 0; i < NRMAX; i++) xr[i] = x + (size_t)(r0 + (r0 + i < R ? i : 0)) * I;
#define DENSE(nr) dot_block(xr, wd, I, y, O, r0, o_part + o0, no, nr, 1)
#define DEQUANTIZED(nr) dot_block(xr, wd, I, y, O, r0, o_part + o0, no, nr, 0) /* wb: in L1, nothing to prefetch */
#define QUANT(nr, t) qdot_block(xr, wr, P->row_bytes, I, y, O, r0, o_part + o0, no, nr, t)
#define Q40(nr) QUANT(nr, Q_4_0)
#define Q41(nr) QUANT(nr, Q_4_1)
#define Q80(nr) QUANT(nr, Q_8_0)
#define Q4K(nr) QUANT(nr, Q_4_K)
#define Q5K(nr) QUANT(nr, Q_5_K)
#define Q6K(nr) QUANT(nr, Q_6_K)
            switch (qt_run) {
                case Q_DENSE:
                    if (qt == Q_DENSE) {
                        NR_SWITCH(DENSE);
                    } else {
                        NR_SWITCH(DEQUANTIZED);
                    }
                    break;
                case Q_4_0: NR_SWITCH(Q40); break;
                case Q_4_1: NR_SWITCH(Q41); break;
                case Q_8_0: NR_SWITCH(Q80); break;
                case Q_4_K: NR_SWITCH(Q4K); break;
                case Q_5_K: NR_SWITCH(Q5K); break;
                default: NR_SWITCH(Q6K); break;
            }
#undef DENSE
#undef DEQUANTIZED
#undef QUANT
#undef Q40
#undef Q41
#undef Q80
#undef Q4K
#undef Q5K
#undef Q6K
        }
    }
    free(wb);
}


#ifndef FUSED_F32
/* AMX: y^T = w x^T, tiles of 16 outputs x N rows (N = R, or 16 column blocks beyond 16 rows),
 * four tiles (64 outputs of one part) per block, for every part whose outputs come in sixteens.
 * Dense parts are read in place. Quantized parts only where the process asked for it (AMX_BLOCKS:
 * see fused_init): their 64 rows are dequantized in registers (deq32_bf16, the values every other
 * path multiplies), a chunk of inputs at a time, into a buffer that stays in L1, and fed to the
 * tiles from there. Each output element is the same sequence of TDPBF16PS steps over k (from zero,
 * 32 inputs a step, in order) whatever N is and whether the part is dense or quantized:
 * row-invariant like the kernel above, a quantized matrix gives what its dequantized dense copy
 * gives, and the hardware reads each weight once for up to 16 rows at near one-row cost. Beyond
 * 16 rows every sum still stays in a tile up to 64 rows (17-32: 2 output tiles a block times 2
 * column blocks; 33-64: 1 times 3 or 4); beyond 64 a column block's tiles are stored between
 * chunks and loaded back (exact: fp32 out, fp32 in). Each chunk is dequantized once for all rows.
 *
 * Measured (SmolLM2's GGUF blocks, 2-core Xeon with AMX, reports/batching/forward_rows.py): a
 * one-row forward costs more on the tiles than on AVX-512 dot products (the dequantized values
 * make a round trip through memory, and the tile steps do not overlap the dequantizing), 4 rows
 * about the same, 32 rows less than half: hence a choice per process, not the default. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

enum { AMX_DENSE = 1, AMX_BLOCKS = 2 };
static int use_amx = 0; /* AMX_* bits, set by fused_init: the same kernels for every call of a process */

#define AMX_KC 256 /* inputs per chunk of dequantized weights beyond 64 rows (64 up to 64): 64 rows x 256 bf16 = 32 KB */
#define AMX_PF 8    /* prefetch each weight row at least this many groups of 32 inputs ahead */

/* Rows o .. o + n - 1 of quantized part P, inputs kc .. kc + kn - 1, as bf16 into wbuf (n, ks);
 * the same rows' bytes a chunk (at least AMX_PF groups) ahead prefetched on the way */
static inline __attribute__((always_inline)) void dequant_chunk_t(const Part *P, int o, int n, int kc, int kn, int ks, int I,
                                                                   const int qt, bf16 *wbuf) {
    const int G = I / 32, ahead = kc / 32 + (kn / 32 > AMX_PF ? kn / 32 : AMX_PF);
    const long gb = P->row_bytes / G, span = (long)(kn / 32) * gb;
    for (int j = 0; j < n; j++) {
        const uint8_t *row = (const uint8_t *)P->data + (size_t)(o + j) * P->row_bytes;
        if (ahead < G)
            for (long b = 0; b < span; b += 64) _mm_prefetch((const char *)(row + ahead * gb + b), _MM_HINT_T1);
        for (int k = 0; k < kn; k += 32) _mm512_store_si512(wbuf + (size_t)j * ks + k, deq32_bf16(row, qt, (kc + k) / 32));
    }
}

static void dequant_chunk(const Part *P, int o, int n, int kc, int kn, int ks, int I, bf16 *wbuf) {
    switch (P->type) { /* each type's loop compiled with its constant */
        case Q_4_0: dequant_chunk_t(P, o, n, kc, kn, ks, I, Q_4_0, wbuf); break;
        case Q_4_1: dequant_chunk_t(P, o, n, kc, kn, ks, I, Q_4_1, wbuf); break;
        case Q_8_0: dequant_chunk_t(P, o, n, kc, kn, ks, I, Q_8_0, wbuf); break;
        case Q_4_K: dequant_chunk_t(P, o, n, kc, kn, ks, I, Q_4_K, wbuf); break;
        case Q_5_K: dequant_chunk_t(P, o, n, kc, kn, ks, I, Q_5_K, wbuf); break;
        default: dequant_chunk_t(P, o, n, kc, kn, ks, I, Q_6_K, wbuf); break;
    }
}

/* The parts of w that AMX computes (a bit per part): with AMX in use and inputs in 32s, every
 * part whose outputs come in 16s (quantized ones under AMX_BLOCKS), whatever the other parts are */
static int amx_parts(const Mat *w, int I) {
    int which = 0;
    if (use_amx && I % 32 == 0)
        for (int p = 0; p < w->nparts; p++)
            which |= (w->part[p].rows % 16 == 0 && (w->part[p].type == Q_DENSE || (use_amx & AMX_BLOCKS && !is_packed(w->part[p].type)))) << p;
    return which;
}

/* r[i] lane j <- r[j] lane i: a 16 x 16 transpose of 32-bit lanes (fp32 sums, or pairs of bf16
 * moved as one dword), data movement only */
static inline __attribute__((always_inline)) void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88), r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
}

/* A stored tile of 16 outputs x 16 rows (c[i * 16 + n]: output i, row n) into y's first nr rows
 * (O apart) at those 16 outputs: transposed in registers, a row's 16 sums stored at once */
static inline __attribute__((always_inline)) void amx_put16(const float *c, float *y, int O, int nr) {
    __m512 v[16];
    for (int i = 0; i < 16; i++) v[i] = _mm512_loadu_ps(c + i * 16);
    transpose16(v);
    for (int n = 0; n < nr; n++) _mm512_storeu_ps(y + (size_t)n * O, v[n]);
}

/* the parts of w in `which`; xv: scratch of (ceil(R / 16) * 16) * I bf16, shared by the threads */
static void matmul_amx(const bf16 *x, int R, int I, const Mat *w, int O, float *y, bf16 *xv, int which) {
    const int N = R < 16 ? R : 16, ncb = (R + 15) / 16, K2 = I / 2;
#pragma omp for schedule(static)
    for (int cb = 0; cb < ncb; cb++) { /* x^T in pairs along k (the VNNI layout): [cb][k / 2][n][2] */
        const int nr = R - cb * 16 < N ? R - cb * 16 : N; /* rows of this column block; the rest zero */
        int k2 = 0;
        if (N == 16) /* 16 rows x 16 pairs at a time, transposed in registers */
            for (; k2 + 16 <= K2; k2 += 16) {
                __m512 v[16];
                for (int n = 0; n < 16; n++)
                    v[n] = n < nr ? _mm512_castsi512_ps(_mm512_loadu_si512(x + (size_t)(cb * 16 + n) * I + 2 * k2)) : _mm512_setzero_ps();
                transpose16(v);
                for (int j = 0; j < 16; j++) _mm512_storeu_ps(xv + ((size_t)cb * K2 + k2 + j) * 32, v[j]);
            }
        for (; k2 < K2; k2++)
            for (int n = 0; n < N; n++) {
                bf16 *d = xv + (((size_t)cb * K2 + k2) * N + n) * 2;
                d[0] = n < nr ? x[(size_t)(cb * 16 + n) * I + 2 * k2] : 0;
                d[1] = n < nr ? x[(size_t)(cb * 16 + n) * I + 2 * k2 + 1] : 0;
            }
    }
    TileConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = t == 4 || t == 5 ? 64 : N * 4; /* 0-3: y tiles, 4-5: w tiles, 6-7: x tiles */
    }
    _tile_loadconfig(&cfg);
    /* Blocks of bt tiles (16 outputs each), shared out between the threads in order: 4 tiles a
     * block unless 3 or 2 leave the threads less uneven (SmolLM2's 576 outputs: 9 blocks of 4,
     * 5 against 4 on two threads; 12 of 3, 6 and 6). Each output's sums do not depend on it. */
    const int nth = omp_get_num_threads();
    int nb[3] = {0, 0, 0}, blocks = 0, quantized = 0, bt = 4, best = -1;
    /* 17..32 rows: 2 tiles a block, 33..64: 1, so that every sum stays in a tile (4 of them) */
    const int cmax = ncb == 1 ? 4 : ncb == 2 ? 2 : ncb <= 4 ? 1 : 4, cmin = ncb == 1 || ncb > 4 ? 2 : cmax;
    for (int c = cmax; c >= cmin; c--) {
        int nblk = 0;
        for (int p = 0; p < w->nparts; p++)
            if (which >> p & 1) nblk += (w->part[p].rows / 16 + c - 1) / c;
        const int most = (nblk + nth - 1) / nth * c; /* tiles of the busiest thread, at most */
        if (best < 0 || most < best) best = most, bt = c;
    }
    for (int p = 0; p < w->nparts; p++)
        if (which >> p & 1) blocks += nb[p] = (w->part[p].rows / 16 + bt - 1) / bt, quantized |= w->part[p].type != Q_DENSE;
    /* A quantized part's chunk: 64 inputs up to 64 rows, AMX_KC beyond (where the tiles are stored
     * and loaded back between chunks); two buffers used in turn, the next chunk dequantized before
     * the tiles read this one (measured faster than reading what was just written) */
    const int KQ = ncb <= 4 ? 64 : AMX_KC;
    bf16 *wbuf = quantized ? aligned_alloc(64, sizeof(bf16) * 2 * 64 * KQ) : NULL; /* this thread's chunks */
    float *cbuf = ncb > 4 ? malloc(sizeof(float) * (size_t)ncb * 4 * 256) : NULL;  /* its tiles between chunks */
#pragma omp for schedule(static)
    for (int b = 0; b < blocks; b++) {
        int ob, o_part; /* the block's index in its part, the part's first output */
        const Part *P = &w->part[block_part(w, nb, b, &ob, &o_part)];
        const int o0 = ob * 16 * bt, nt = P->rows - o0 >= 16 * bt ? bt : (P->rows - o0) / 16, dense = P->type == Q_DENSE;
        const int KC = dense ? I : KQ;
        const long as = (long)(dense ? I : KQ) * 2;             /* bytes between the w tiles' rows */
        const size_t at = (size_t)16 * (dense ? I : KQ); /* elements between the w tiles */
        for (int kc = 0; kc < I; kc += KC) {
            const int kn = I - kc < KC ? I - kc : KC, last = kc + kn >= I;
            bf16 *buf = dense ? NULL : wbuf + (size_t)(kc / KC % 2) * 64 * KQ; /* a quantized part's chunk */
            const bf16 *a = dense ? (const bf16 *)P->data + (size_t)o0 * I + kc : buf;
            if (!dense) { /* chunk kc was dequantized a step earlier (the first just now); the next now */
                if (kc == 0) dequant_chunk(P, o0, 16 * nt, 0, kn, KQ, I, buf);
                if (!last) {
                    const int kn2 = I - (kc + KC) < KC ? I - (kc + KC) : KC;
                    dequant_chunk(P, o0, 16 * nt, kc + KC, kn2, KQ, I, wbuf + (size_t)((kc / KC + 1) % 2) * 64 * KQ);
                }
            }
            if (ncb == 2) { /* 17..32 rows: tile t's sums for column block cb in tile 2 cb + t, all chunks long */
                if (kc == 0) {
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                }
                for (int k = 0; k < kn; k += 32) {
                    _tile_loadd(6, xv + ((size_t)(kc + k) / 2) * 32, 64);
                    _tile_loadd(7, xv + ((size_t)K2 + (kc + k) / 2) * 32, 64);
                    _tile_loadd(4, a + k, as);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(2, 4, 7);
                    if (nt > 1) {
                        _tile_loadd(5, a + at + k, as);
                        _tile_dpbf16ps(1, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                }
                if (!last) continue;
                float c[4][16 * 16];
                _tile_stored(0, c[0], 64);
                _tile_stored(2, c[2], 64);
                if (nt > 1) {
                    _tile_stored(1, c[1], 64);
                    _tile_stored(3, c[3], 64);
                }
                for (int cb = 0; cb < 2; cb++)
                    for (int t = 0; t < nt; t++)
                        amx_put16(c[2 * cb + t], y + (size_t)cb * 16 * O + o_part + o0 + 16 * t, O, R - cb * 16 < 16 ? R - cb * 16 : 16);
                continue;
            }
            if (ncb == 3 || ncb == 4) { /* 33..64 rows: one tile a block, its sums for column block cb in tile cb */
                if (kc == 0) {
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                }
                for (int k = 0; k < kn; k += 32) {
                    const bf16 *xk = xv + ((size_t)(kc + k) / 2) * 32; /* column block cb's at + cb K2 32 */
                    _tile_loadd(4, a + k, as);
                    _tile_loadd(5, xk, 64);
                    _tile_dpbf16ps(0, 4, 5);
                    _tile_loadd(6, xk + (size_t)K2 * 32, 64);
                    _tile_dpbf16ps(1, 4, 6);
                    _tile_loadd(7, xk + (size_t)2 * K2 * 32, 64);
                    _tile_dpbf16ps(2, 4, 7);
                    if (ncb == 4) {
                        _tile_loadd(5, xk + (size_t)3 * K2 * 32, 64);
                        _tile_dpbf16ps(3, 4, 5);
                    }
                }
                if (!last) continue;
                float c[4][16 * 16];
                _tile_stored(0, c[0], 64);
                _tile_stored(1, c[1], 64);
                _tile_stored(2, c[2], 64);
                if (ncb == 4) _tile_stored(3, c[3], 64);
                for (int cb = 0; cb < ncb; cb++)
                    amx_put16(c[cb], y + (size_t)cb * 16 * O + o_part + o0, O, R - cb * 16 < 16 ? R - cb * 16 : 16);
                continue;
            }
            for (int cb = 0; cb < ncb; cb++) {
                float *cs = cbuf ? cbuf + (size_t)cb * 4 * 256 : NULL;
                if (kc == 0) {
                    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                } else if (cs) {
                    _tile_loadd(0, cs, 64);
                    if (nt > 1) _tile_loadd(1, cs + 256, 64);
                    if (nt > 2) _tile_loadd(2, cs + 512, 64);
                    if (nt > 3) _tile_loadd(3, cs + 768, 64);
                }
                for (int k = 0; k < kn; k += 32) {
                    _tile_loadd(6, xv + ((size_t)cb * K2 + (kc + k) / 2) * N * 2, N * 4);
                    _tile_loadd(4, a + k, as);
                    _tile_dpbf16ps(0, 4, 6);
                    if (nt > 1) { _tile_loadd(5, a + at + k, as); _tile_dpbf16ps(1, 5, 6); }
                    if (nt > 2) { _tile_loadd(4, a + 2 * at + k, as); _tile_dpbf16ps(2, 4, 6); }
                    if (nt > 3) { _tile_loadd(5, a + 3 * at + k, as); _tile_dpbf16ps(3, 5, 6); }
                }
                if (!last) { /* ncb > 4 here: keep this block's sums for the next chunk (up to 4 they stay in the tiles) */
                    if (cs) {
                        _tile_stored(0, cs, 64);
                        if (nt > 1) _tile_stored(1, cs + 256, 64);
                        if (nt > 2) _tile_stored(2, cs + 512, 64);
                        if (nt > 3) _tile_stored(3, cs + 768, 64);
                    }
                    continue;
                }
                float c[4][16 * 16];
                _tile_stored(0, c[0], N * 4);
                if (nt > 1) _tile_stored(1, c[1], N * 4);
                if (nt > 2) _tile_stored(2, c[2], N * 4);
                if (nt > 3) _tile_stored(3, c[3], N * 4);
                const int nr = R - cb * 16 < N ? R - cb * 16 : N; /* rows of this column block */
                for (int t = 0; t < nt; t++) {
                    float *yt = y + (size_t)cb * 16 * O + o_part + o0 + 16 * t; /* row cb * 16, output o0 + 16 t */
                    if (N == 16) amx_put16(c[t], yt, O, nr);
                    else
                        for (int n = 0; n < nr; n++)
                            for (int i = 0; i < 16; i++) yt[(size_t)n * O + i] = c[t][i * N + n];
                }
            }
        }
    }
    free(wbuf);
    free(cbuf);
    _tile_release();
}
#endif

#ifndef FUSED_F32
/* 8-bit activations (`--dtype q8`, quant.py's packed types): a GGUF file's Q4_0 / Q4_1 / Q8_0
 * blocks regrouped at load for VNNI, and each matmul input quantized per row and per 32 inputs
 * to int8 as llama.cpp quantizes its activations (d = max|x| / 127, q = x / d rounded to
 * nearest even). Sums of int8 products are exact integers (VPDPBUSD), so a block's dot product
 * has one value whatever the order; only its scaling is fp32. Per output and row, one chain over
 * the blocks in input order: acc = fma(float(int dot - off * sum q), d_w * d_x, acc), then for
 * Q4_1 acc = fma(m_w, d_x * sum q, acc). The same chain for every row count and every split
 * between threads: row-invariant like the kernels above, with their guarantees (a verify pass
 * equals one-row passes, a tree row equals its path) for this dtype. It is not the bf16 model:
 * quantizing activations changes the sums (its own plain decoding is the reference).
 *
 * Layout (a "column group" is 16 outputs; its row in the Part holds its I/32 blocks in input
 * order, `pblk` bytes each): Q4: 4 chunks of 64 bytes, chunk j lane n byte b = weight (n, 8j + b)
 * in the low nibble and (n, 8j + 4 + b) in the high one; then 16 fp16 d (Q4_1: then 16 fp16 m).
 * Q8_0: 8 chunks, chunk j lane n byte b = weight (n, 4j + b) + 128 as a byte; then 16 fp16 d. */
#define QRB 8
#define Q8_PF 8192

/* x rows [r0, r1) of (R, I) -> xq (R, I) int8, dx (R, I/32) scales and sx (R, I/32) sums of each block's q */
static void quantize_rows(const bf16 *x, int r0, int r1, int I, int8_t *xq, float *dx, int32_t *sx) {
    const int G = I / 32;
    for (int r = r0; r < r1; r++)
        for (int g = 0; g < G; g++) {
            const bf16 *p = x + (size_t)r * I + 32 * g;
            const __m512 a = ld16(p, 16), b = ld16(p + 16, 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            const __m512 vid = _mm512_set1_ps(id);
            const __m512i qa = _mm512_cvt_roundps_epi32(_mm512_mul_ps(a, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512i qb = _mm512_cvt_roundps_epi32(_mm512_mul_ps(b, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm_storeu_si128((__m128i *)(xq + (size_t)r * I + 32 * g), _mm512_cvtepi32_epi8(qa));
            _mm_storeu_si128((__m128i *)(xq + (size_t)r * I + 32 * g + 16), _mm512_cvtepi32_epi8(qb));
            dx[(size_t)r * G + g] = d;
            sx[(size_t)r * G + g] = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
        }
}

static inline __m512i bcast4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm512_set1_epi32(v); }

/* y[r0 + i][o0 .. o0 + no - 1] for nr <= QRB rows against one column group wc (G blocks) */
static inline __attribute__((always_inline)) void q8_cols(const uint8_t *wc, int G, const int8_t *xq, const float *dx,
                                                          const int32_t *sx, int I, int r0, const int nr, const int qt,
                                                          float *y, int O, int o0, int no) {
    __m512 acc[QRB];
    const int8_t *xr[QRB];
    for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps(), xr[i] = xq + (size_t)(r0 + i) * I;
    const int B = pblk(qt), off = qt == P_8_0 ? 128 : qt == P_4_0 ? 8 : 0;
    const __m512i f = _mm512_set1_epi8(0x0F);
    /* NA integer accumulators per row, summed at the end of each block: independent chains for
     * few rows (integer sums: any grouping gives the same value) */
    const int NA = nr >= 4 ? 1 : nr >= 2 ? 2 : 4;
    for (int g = 0; g < G; g++) {
        const uint8_t *b = wc + (size_t)B * g;
        for (int l = 0; l < B; l += 64) _mm_prefetch((const char *)b + Q8_PF + l, _MM_HINT_T1); /* a hint: never faults */
        __m512i ia[QRB][4];
        for (int i = 0; i < nr; i++)
            for (int a = 0; a < NA; a++) ia[i][a] = _mm512_setzero_si512();
        if (qt == P_8_0) {
            for (int j = 0; j < 8; j++) {
                const __m512i w = _mm512_loadu_si512(b + 64 * j);
                for (int i = 0; i < nr; i++) ia[i][j % NA] = _mm512_dpbusd_epi32(ia[i][j % NA], w, bcast4(xr[i] + 32 * g + 4 * j));
            }
        } else {
            for (int j = 0; j < 4; j++) {
                const __m512i v = _mm512_loadu_si512(b + 64 * j);
                const __m512i lo = _mm512_and_si512(v, f), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), f);
                for (int i = 0; i < nr; i++) {
                    ia[i][(2 * j) % NA] = _mm512_dpbusd_epi32(ia[i][(2 * j) % NA], lo, bcast4(xr[i] + 32 * g + 8 * j));
                    ia[i][(2 * j + 1) % NA] = _mm512_dpbusd_epi32(ia[i][(2 * j + 1) % NA], hi, bcast4(xr[i] + 32 * g + 8 * j + 4));
                }
            }
        }
        for (int i = 0; i < nr; i++) {
            if (NA == 4) ia[i][0] = _mm512_add_epi32(_mm512_add_epi32(ia[i][0], ia[i][1]), _mm512_add_epi32(ia[i][2], ia[i][3]));
            else if (NA == 2) ia[i][0] = _mm512_add_epi32(ia[i][0], ia[i][1]);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + (qt == P_8_0 ? 512 : 256))));
        const __m512 m = qt == P_4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b + 288))) : d;
        for (int i = 0; i < nr; i++) {
            const size_t rg = (size_t)(r0 + i) * (I / 32) + g;
            const __m512i t = off ? _mm512_sub_epi32(ia[i][0], _mm512_set1_epi32(off * sx[rg])) : ia[i][0];
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(d, _mm512_set1_ps(dx[rg])), acc[i]);
            if (qt == P_4_1) {
                const float s = dx[rg] * (float)sx[rg];
                acc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(s), acc[i]);
            }
        }
    }
    for (int i = 0; i < nr; i++) _mm512_mask_storeu_ps(y + (size_t)(r0 + i) * O + o0, m16(no), acc[i]);
}

#define QRB_SWITCH(CALL)                                  \
    switch (nr) {                                         \
        case 1: CALL(1); break;                           \
        case 2: CALL(2); break;                           \
        case 3: CALL(3); break;                           \
        case 4: CALL(4); break;                           \
        case 5: CALL(5); break;                           \
        case 6: CALL(6); break;                           \
        case 7: CALL(7); break;                           \
        default: CALL(8); break;                          \
    }

/* The packed parts of w in `which`: x quantized (R * I * 1.25 bytes), then every column group of
 * those parts, shared out between the threads. A few rows (a decoding step, a verify pass) are
 * quantized by each thread into its own stack, with no barrier; more into the scratch xv
 * (within the (R rounded up to 16) * I elements every caller gives), shared. amx_before: an
 * AMX call before this one may still read xv. */
#define Q8_LOCAL 24576 /* bytes of int8 rows a thread quantizes for itself */
static void matmul_q8(const bf16 *x, int R, int I, const Mat *w, int O, float *y, bf16 *xv, int which, int amx_before) {
    const int G = I / 32;
    const int local = (size_t)R * I <= Q8_LOCAL;
    int8_t own[local ? (size_t)R * I + 8 * (size_t)R * G + 64 : 1] __attribute__((aligned(64)));
    int8_t *xq = local ? own : (int8_t *)xv;
    float *dx = (float *)(xq + ((size_t)R * I + 63) / 64 * 64);
    int32_t *sx = (int32_t *)(dx + (size_t)R * G);
    if (local)
        quantize_rows(x, 0, R, I, xq, dx, sx);
    else {
        if (amx_before) {
#pragma omp barrier
        }
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) quantize_rows(x, r, r + 1, I, xq, dx, sx);
    }
    int nb[3] = {0, 0, 0}, groups = 0;
    for (int p = 0; p < w->nparts; p++)
        if (which >> p & 1) groups += nb[p] = (w->part[p].rows + 15) / 16;
#pragma omp for schedule(static)
    for (int c = 0; c < groups; c++) {
        int cg, o_part; /* the column group's index in its part, the part's first output */
        const Part *P = &w->part[block_part(w, nb, c, &cg, &o_part)];
        const uint8_t *wc = (const uint8_t *)P->data + (size_t)cg * P->row_bytes;
        const int o0 = 16 * cg, no = P->rows - o0 < 16 ? P->rows - o0 : 16, qt = P->type;
        for (int r0 = 0; r0 < R; r0 += QRB) {
            const int nr = R - r0 < QRB ? R - r0 : QRB;
#define Q8C(n, t) q8_cols(wc, G, xq, dx, sx, I, r0, n, t, y, O, o_part + o0, no)
#define C40(n) Q8C(n, P_4_0)
#define C41(n) Q8C(n, P_4_1)
#define C80(n) Q8C(n, P_8_0)
            switch (qt) {
                case P_4_0: QRB_SWITCH(C40); break;
                case P_4_1: QRB_SWITCH(C41); break;
                default: QRB_SWITCH(C80); break;
            }
#undef Q8C
#undef C40
#undef C41
#undef C80
        }
    }
}

/* One packed row o's group g as its original GGUF block (blk: 18, 20 or 34 bytes), for lookups */
static void unpack_block(const Part *P, int o, int g, uint8_t *blk) {
    const uint8_t *b = (const uint8_t *)P->data + (size_t)(o / 16) * P->row_bytes + (size_t)pblk(P->type) * g;
    const int n = o % 16;
    if (P->type == P_8_0) {
        memcpy(blk, b + 512 + 2 * n, 2);
        for (int k = 0; k < 32; k++) blk[2 + k] = b[64 * (k / 4) + 4 * n + k % 4] ^ 0x80;
        return;
    }
    const int q0 = P->type == P_4_1 ? 4 : 2;
    memcpy(blk, b + 256 + 2 * n, 2);
    if (P->type == P_4_1) memcpy(blk + 2, b + 288 + 2 * n, 2);
    for (int k = 0; k < 32; k++) {
        const int u = b[64 * (k / 8) + 4 * n + k % 4] >> (4 * (k / 4 % 2)) & 15;
        blk[q0 + k % 16] = k < 16 ? (uint8_t)u : (uint8_t)(blk[q0 + k % 16] | u << 4);
    }
}
#endif

/* Called inside a parallel region: the output blocks are shared out between the threads. Which
 * kernel runs for a part depends on that part's weights and shape and the process only, never on
 * R or on the parts stacked with it: AMX for a part (dense or quantized) whose shape fits its
 * tiles, dot products otherwise. */
static void matmul(const elem *x, int R, int I, const Mat *w, int O, float *y, elem *xv) {
    int amx = 0;
#ifdef FUSED_F32
    (void)xv;
#else
    if ((amx = amx_parts(w, I))) matmul_amx(x, R, I, w, O, y, xv, amx);
    int q8 = 0;
    for (int p = 0; p < w->nparts; p++) q8 |= is_packed(w->part[p].type) << p;
    if (q8) matmul_q8(x, R, I, w, O, y, xv, q8, amx != 0);
    amx |= q8;
#endif
    const int rest = ((1 << w->nparts) - 1) & ~amx;
    if (rest) matmul_dp(x, R, I, w, O, y, rest);
}

/* matmul for a dense matrix, as the head's own weights are */
static void matmul_dense(const elem *x, int R, int I, const elem *w, int O, float *y, elem *xv) {
    const Mat m = dense_mat(w, O, I);
    matmul(x, R, I, &m, O, y, xv);
}

/* Ask the kernel for the AMX tile state (Linux: ARCH_REQ_XCOMP_PERM). amx: 0 keeps to AVX-512;
 * AMX_DENSE runs dense matrices on the tiles; AMX_DENSE | AMX_BLOCKS quantized ones too (for
 * processes that batch many rows). Returns the bits in use. Call once, before any forward. */
int fused_init(int amx) {
#ifdef FUSED_F32
    (void)amx;
    return 0; /* no fp32 tiles */
#else
    use_amx = amx && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? amx : 0;
    return use_amx;
#endif
}

/* The AMX_* bits in use (fused_init's last answer) */
int fused_amx(void) {
#ifdef FUSED_F32
    return 0;
#else
    return use_amx;
#endif
}

/* out (R, D) = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))), per row (as w * F.rms_norm(x)). */
static void rms_norm(const elem *x, int R, int D, const elem *w, float eps, elem *out) {
#pragma omp for schedule(static)
    for (int r = 0; r < R; r++) {
        const elem *xr = x + (size_t)r * D;
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
static void residual(elem *x, const float *y, const elem *b, int R, int D) {
#pragma omp for schedule(static)
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d += 16) {
            elem *xr = x + (size_t)r * D + d;
            st16(xr, _mm512_add_ps(ld16(xr, D - d), biased(y + (size_t)r * D + d, b ? b + d : NULL, D - d)), D - d);
        }
}

/* One head of a q/k/v projection's fp32 output: bf16 (+ bias), then RoPE where cos is given:
 * bf16(bf16(v * cos) + bf16(rotate_half(v) * signed sin)), as apply_rope_signed rounds. */
static void project_head(const float *yr, const elem *b, int hd, const elem *cos, const elem *sin, elem *dst) {
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
static void swiglu(const float *y, const elem *bg, int R, int M, elem *g) {
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
    int n_layers, D, H, Hk, hd, M, V;
    /* per layer: weights (bf16, row-major (out, in)), biases (NULL = none), norm weights */
    const elem **attn_norm, **mlp_norm, **bqkv, **bo, **bgu, **bdown;
    const Mat *wqkv, *wo, *wgu, *wdown; /* per layer: the matrices (q, k, v and gate, up: parts) */
    const float *attn_eps, *mlp_eps, *scale;
    const int *rope;   /* 1: RoPE in this layer, 0: none (SmolLM3's NoPE layers) */
    const int *window; /* sliding window width, 0 = full attention */
    const elem *final_norm;
    float final_eps;
    Mat lm_w;
    const elem *lm_b;
} Model;

/* For each of NQ queries j: oacc[j] (hd) fp32 += sum over the cnt rows v (cnt, hd) fp32, in
 * order, of p[j][i] * v[i] (p: the normalised probabilities); NV >= hd / 16. Called block
 * after block, it is one FMA chain per lane over a query's slots in slot order, the same
 * whichever queries share the call (they only share the loads of v, and their chains run side
 * by side instead of waiting on each other's latency). */
static inline __attribute__((always_inline)) void value_rows(const float *const *p, int cnt, const float *v,
                                                              int hd, float *const *oacc, const int NQ, const int NV) {
    __m512 o[6][16];
#pragma GCC unroll 6
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) o[q][j] = ldf(oacc[q] + 16 * j, hd - 16 * j);
    for (int i = 0; i < cnt; i++) {
        __m512 vv[16];
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) vv[j] = ldf(v + (size_t)i * hd + 16 * j, hd - 16 * j);
#pragma GCC unroll 6
        for (int q = 0; q < NQ; q++) {
            const __m512 pv = _mm512_set1_ps(p[q][i]);
#pragma GCC unroll 16
            for (int j = 0; j < NV; j++) o[q][j] = _mm512_fmadd_ps(pv, vv[j], o[q][j]);
        }
    }
#pragma GCC unroll 6
    for (int q = 0; q < NQ; q++)
#pragma GCC unroll 16
        for (int j = 0; j < NV; j++) _mm512_mask_storeu_ps(oacc[q] + 16 * j, m16(hd - 16 * j), o[q][j]);
}

/* value_rows for nq queries (score rows p[j] and sums oacc[j]), several at a time */
static void value_sum(const float *const *p, int nq, int cnt, const float *v, int hd, float *const *oacc) {
    const int nv = (hd + 15) / 16;
    for (int q = 0; q < nq;) {
        const int left = nq - q;
        if (nv <= 4) { /* a constant register count: the sums stay in registers */
            switch (left >= 5 ? 5 : left) {
                case 1: value_rows(p + q, cnt, v, hd, oacc + q, 1, 4); q += 1; break;
                case 2: value_rows(p + q, cnt, v, hd, oacc + q, 2, 4); q += 2; break;
                case 3: value_rows(p + q, cnt, v, hd, oacc + q, 3, 4); q += 3; break;
                case 4: value_rows(p + q, cnt, v, hd, oacc + q, 4, 4); q += 4; break;
                default: value_rows(p + q, cnt, v, hd, oacc + q, 5, 4); q += 5; break;
            }
        } else if (nv <= 8) {
            if (left >= 2) { value_rows(p + q, cnt, v, hd, oacc + q, 2, 8); q += 2; }
            else { value_rows(p + q, cnt, v, hd, oacc + q, 1, 8); q += 1; }
        } else {
            value_rows(p + q, cnt, v, hd, oacc + q, 1, 16); q += 1;
        }
    }
}

/* The 16 lane sums of acc[0..15] as one vector (lane m: acc[m]'s sum), each by the tree of
 * _mm512_reduce_add_ps (lanes l + l+8, then + l+4, then + l+2, then + l+1), transposed so that
 * the sixteen share each shuffle: a sum's bits do not depend on its place or its neighbours. */
static inline __attribute__((always_inline)) __m512 reduce16(const __m512 *acc) {
    __m512 w[4], u[2];
    for (int m = 0; m < 4; m++) w[m] = reduce_halves4(acc + 4 * m); /* 128-bit block b: acc 4m + b */
    for (int m = 0; m < 2; m++) /* block b: [acc 8m + b: 2 sums, acc 8m + 4 + b: 2 sums], + l+2 */
        u[m] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * m], w[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(w[2 * m], w[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* + l+1: lane 4b + q holds acc 4q + b; transposed back to acc order */
    const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), t);
}

/* s[j] = scale * (kp[j] . q) for j < cnt (<= 16 slots): one chain over hd per slot, reduced by
 * reduce16. */
static inline void scores16(const elem *const *kp, const elem *q, int hd, float scale, float *s, int cnt) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) acc[j] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += KSTEP) {
        const kvec qv = ldk(q + d, hd - d);
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) acc[j] = dotk(acc[j], ldk(kp[j] + d, hd - d), qv);
    }
    _mm512_mask_storeu_ps(s, m16(cnt), _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale)));
}

/* s[j][i] = scale * (k row i . q[j]) for 16 key rows at kb (stride hd) and NQ queries (1, 2 or
 * 4), 16 / NQ key rows at a time: each key vector is loaded once for the NQ queries. Every score
 * is scores16's chain and tree, so it does not depend on which queries share the call. */
static inline __attribute__((always_inline)) void scores_shared(const elem *kb, const elem *const *q, int hd, float scale,
                                                                 float *const *s, const int NQ) {
    const int NS = 16 / NQ;
    for (int s0 = 0; s0 < 16; s0 += NS) {
        __m512 acc[16]; /* acc[jq * NS + t]: query jq, key row s0 + t */
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += KSTEP) {
            kvec qv[4];
#pragma GCC unroll 4
            for (int jq = 0; jq < NQ; jq++) qv[jq] = ldk(q[jq] + d, hd - d);
#pragma GCC unroll 16
            for (int t = 0; t < NS; t++) {
                const kvec kv = ldk(kb + (size_t)(s0 + t) * hd + d, hd - d);
#pragma GCC unroll 4
                for (int jq = 0; jq < NQ; jq++) acc[jq * NS + t] = dotk(acc[jq * NS + t], kv, qv[jq]);
            }
        }
        const __m512 r = _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale));
#pragma GCC unroll 4
        for (int jq = 0; jq < NQ; jq++)
            _mm512_mask_storeu_ps(s[jq] + s0, m16(NS), _mm512_maskz_compress_ps((__mmask16)(((1u << NS) - 1) << (jq * NS)), r));
    }
}

#ifndef FUSED_F32
/* Scores of N <= 16 queries against 16 key rows by AMX: c[i * N + n] = k row i . query n, each
 * one chain of TDPBF16PS steps over hd in 32-element steps (hd % 32 == 0), whatever the other
 * rows and queries of the tile. k rows at kb + i * kstride; qv: the queries in VNNI pairs
 * [hd / 2][N][2]. The tile configuration is set by the caller (attend). */
static inline void amx_scores16(const bf16 *kb, int kstride, const bf16 *qv, int N, int hd, float *c) {
    _tile_zero(0);
    for (int k = 0; k < hd; k += 32) {
        _tile_loadd(1, kb + k, kstride * 2);
        _tile_loadd(2, qv + (size_t)(k / 2) * N * 2, N * 4);
        _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, c, N * 4);
}
#endif

/* floats of attention scratch per thread: scores (16 x (S + 16)), value sums (16 x 256) and
 * widened values (32 x 256) of up to 16 queries; the AMX tile's results (16 x 16) and staging
 * (the queries in VNNI pairs and 16 gathered key rows, hd <= 256: 2 x 16 x 256 bf16) */
#define ATTEND_SCRATCH(S) ((size_t)16 * ((S) + 16) + 16 * 256 + 32 * 256 + 16 * 16 + 16 * 256)

/* Attention of rows [0, T) over their slots: committed slots 0..start-1 in order, then
 * start + anc[r * T + a] for a < nanc[r] (its ancestors and itself, in depth order).
 * K, Vv (Hk, S, hd): one layer of the cache. q (T, H, hd), out (T, H * hd).
 * win > 0: only positions > pos[r] - win + 1 are visible.
 *
 * One task per (key/value head, chunk of up to 16 of its T x g queries: query (r, e) is row r's
 * head hk * g + e): the chunk's queries share each block of committed keys and values (its
 * scores in one AMX tile where there is AMX, else up to four queries per loaded key vector,
 * scores_shared, each reduced by one fixed tree) and each row's own ancestors come after. Chunks are halved until there are two
 * tasks per thread. Every (row, head) computes exactly what it computes alone, whatever the
 * chunk: each score is one chain over hd, each value sum one FMA chain per lane over the row's
 * slots in slot order. */
/* One sequence's attention as attend_tasks reads it: its layer of the cache K, Vv (Hk, S, hd), its
 * T rows at `start` (pos, nanc, anc as below), their queries q (T, H, hd) and outputs (T, H * hd),
 * and qc, the queries a task takes. */
typedef struct {
    const elem *K, *Vv;
    int S, T, start, qc;
    const int *pos, *nanc, *anc;
    const elem *q;
    elem *out;
} Att;

/* The queries of one task: key/value head hk, queries c * qc .. of sequence A (see attend). */
static inline void attend_task(const Att *A, int H, int Hk, int hd, float scale, int win, int hk, int c, float *scratch) {
    const elem *K = A->K, *Vv = A->Vv, *q = A->q;
    elem *out = A->out;
    const int S = A->S, T = A->T, start = A->start, qc = A->qc;
    const int *pos = A->pos, *nanc = A->nanc, *anc = A->anc;
    const int g = H / Hk, QN = T * g, n_old = start;
#ifndef FUSED_F32
    const int amx = use_amx && hd % 32 == 0 && hd <= 256;
#endif
    {
        const int q0 = c * qc, nq = QN - q0 < qc ? QN - q0 : qc; /* queries q0 .. q0 + nq - 1 */
        float *sc = scratch; /* this thread's: nq x (S + 16) scores */
        float *oacc = sc + (size_t)16 * (S + 16);                                /* nq x 256 value sums */
        float *vbuf = oacc + 16 * 256;                                           /* 32 x 256 widened values */
        float *tile = vbuf + 32 * 256;                                           /* 16 x 16 tile results */
        (void)tile;
        const elem *kh = K + (size_t)hk * S * hd, *vh = Vv + (size_t)hk * S * hd;
        int rowq[16], nslots[16];
        for (int j = 0; j < nq; j++) {
            rowq[j] = (q0 + j) / g;
            nslots[j] = n_old + (anc ? nanc[rowq[j]] : rowq[j] + 1);
        }
#define QPTR(j) (q + ((size_t)rowq[j] * H + hk * g + (q0 + (j)) % g) * hd)
#define SLOT(r, i) ((i) < n_old ? (i) : start + (anc ? anc[(r) * T + ((i) - n_old)] : (i) - n_old))
        /* scores, fp32; masked slots get -inf */
#ifndef FUSED_F32
        if (amx) {
            bf16 *qv = (bf16 *)(tile + 16 * 16), *kg = qv + (size_t)hd * 16; /* [hd / 2][nq][2]; 16 x hd gathered keys */
            for (int k2 = 0; k2 < hd / 2; k2++)
                for (int j = 0; j < nq; j++) {
                    qv[((size_t)k2 * nq + j) * 2] = QPTR(j)[2 * k2];
                    qv[((size_t)k2 * nq + j) * 2 + 1] = QPTR(j)[2 * k2 + 1];
                }
            TileConfig cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.palette = 1;
            cfg.rows[0] = 16; cfg.colsb[0] = nq * 4; /* scores: 16 slots x nq queries */
            cfg.rows[1] = 16; cfg.colsb[1] = 64;     /* 16 key rows x 32 of hd */
            cfg.rows[2] = 16; cfg.colsb[2] = nq * 4; /* 16 pairs of hd x nq queries */
            _tile_loadconfig(&cfg);
            const int rmax = rowq[nq - 1];
            const __m512i cols = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(nq));
            const __m512 vscale = _mm512_set1_ps(scale);
            for (int i0 = 0; i0 < n_old + T; i0 += 16) {
                /* slots i0 .. i0 + 15 of each row's list: shared while all are committed, and in a
                 * chain (each row's own slots follow the committed ones in the cache) while the
                 * block lies in the cache: a score reads its key and query alone, so a row's
                 * visible slots get what they get alone, and the rest are never read */
                if (i0 + 16 <= n_old || (!anc && i0 + 16 <= S)) {
                    /* these slots' values, read after the softmax: fetched into L2 now, beside the keys */
                    for (const char *pv = (const char *)(vh + (size_t)i0 * hd), *pe = pv + (size_t)16 * hd * sizeof(bf16); pv < pe; pv += 64)
                        _mm_prefetch(pv, _MM_HINT_T1);
                    amx_scores16(kh + (size_t)i0 * hd, hd, qv, nq, hd, tile);
                    for (int j = 0; j < nq; j++) /* column j of the tile: query j's 16 scores */
                        _mm512_storeu_ps(sc + (size_t)j * (S + 16) + i0,
                                         _mm512_mul_ps(_mm512_i32gather_ps(_mm512_add_epi32(cols, _mm512_set1_epi32(j)), tile, 4), vscale));
                    continue;
                }
                for (int r = rowq[0]; r <= rmax; r++) { /* a block that reaches a row's own rows: that row's keys */
                    const int nr = n_old + (anc ? nanc[r] : r + 1);
                    if (i0 >= nr) continue;
                    const int cnt = nr - i0 < 16 ? nr - i0 : 16;
                    for (int i = 0; i < 16; i++) {
                        if (i < cnt) memcpy(kg + (size_t)i * hd, kh + (size_t)SLOT(r, i0 + i) * hd, sizeof(bf16) * hd);
                        else memset(kg + (size_t)i * hd, 0, sizeof(bf16) * hd);
                    }
                    amx_scores16(kg, hd, qv, nq, hd, tile);
                    for (int j = 0; j < nq; j++)
                        if (rowq[j] == r)
                            for (int i = 0; i < cnt; i++) sc[(size_t)j * (S + 16) + i0 + i] = tile[i * nq + j] * scale;
                }
            }
            _tile_release();
        } else
#endif
        {
            const int full = n_old / 16 * 16; /* blocks of 16 committed slots: shared by the chunk's queries */
            for (int i0 = 0; i0 < full; i0 += 16) {
                /* these slots' values, read after the softmax: fetched into L2 now, beside the keys */
                for (const char *pv = (const char *)(vh + (size_t)i0 * hd), *pe = pv + (size_t)16 * hd * sizeof(elem); pv < pe; pv += 64)
                    _mm_prefetch(pv, _MM_HINT_T1);
                for (int j = 0; j < nq;) {
                    const elem *qj[4];
                    float *sj[4];
                    const int NQ = nq - j >= 4 ? 4 : nq - j >= 2 ? 2 : 1;
                    for (int t = 0; t < NQ; t++) qj[t] = QPTR(j + t), sj[t] = sc + (size_t)(j + t) * (S + 16) + i0;
                    if (NQ == 4) scores_shared(kh + (size_t)i0 * hd, qj, hd, scale, sj, 4);
                    else if (NQ == 2) scores_shared(kh + (size_t)i0 * hd, qj, hd, scale, sj, 2);
                    else scores_shared(kh + (size_t)i0 * hd, qj, hd, scale, sj, 1);
                    j += NQ;
                }
            }
            for (int j = 0; j < nq; j++) { /* the rest: each row's own list */
                const int r = rowq[j], n = nslots[j];
                for (int i0 = full; i0 < n; i0 += 16) {
                    const int cnt = n - i0 < 16 ? n - i0 : 16;
                    const elem *kp[16];
                    for (int i = 0; i < 16; i++) kp[i] = kh + (size_t)SLOT(r, i0 + (i < cnt ? i : 0)) * hd;
                    scores16(kp, QPTR(j), hd, scale, sc + (size_t)j * (S + 16) + i0, cnt);
                }
            }
        }
        for (int j = 0; j < nq; j++) {
            const int r = rowq[j], n = nslots[j];
            float *s = sc + (size_t)j * (S + 16);
            const int lo = win > 0 && pos[r] - win + 1 > 0 ? pos[r] - win + 1 : 0; /* first visible position */
            for (int i = 0; lo > 0 && i < n; i++)
                if ((i < n_old ? i : pos[anc ? anc[r * T + (i - n_old)] : i - n_old]) < lo) s[i] = -INFINITY;
            /* softmax over the n scores in 16-lane steps (the tail masked: -inf -> 0) */
            __m512 mx = _mm512_set1_ps(-INFINITY);
            for (int i = 0; i < n; i += 16) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m16(n - i), s + i));
            const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
            __m512 sum = _mm512_setzero_ps();
            for (int i = 0; i < n; i += 16) {
                const __mmask16 mk = m16(n - i);
                const __m512 ex = _mm512_maskz_mov_ps(mk, vexp(_mm512_sub_ps(_mm512_mask_loadu_ps(vmax, mk, s + i), vmax)));
                _mm512_mask_storeu_ps(s + i, mk, ex);
                sum = _mm512_add_ps(sum, ex);
            }
            const __m512 vinv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
            for (int i = 0; i < n; i += 16) _mm512_mask_storeu_ps(s + i, m16(n - i), _mm512_mul_ps(ldf(s + i, n - i), vinv));
            memset(oacc + (size_t)j * 256, 0, sizeof(float) * hd);
        }
        /* the value sums in slot order: committed slots in blocks of 32 widened once for all
         * the chunk's queries, then each row's own slots; hd <= 256 */
        for (int i0 = 0; i0 < n_old; i0 += 32) {
            const int cnt = n_old - i0 < 32 ? n_old - i0 : 32;
            for (int i = 0; i < cnt; i++)
                for (int d = 0; d < hd; d += 16) _mm512_storeu_ps(vbuf + (size_t)i * hd + d, ld16(vh + (size_t)(i0 + i) * hd + d, hd - d));
            const float *pj[16];
            float *oj[16];
            for (int j = 0; j < nq; j++) pj[j] = sc + (size_t)j * (S + 16) + i0, oj[j] = oacc + (size_t)j * 256;
            value_sum(pj, nq, cnt, vbuf, hd, oj);
        }
        if (!anc) /* a chain: the rows' own slots widened once per 32, each row's queries summing its visible ones */
            for (int i0 = 0; i0 <= rowq[nq - 1]; i0 += 32) {
                const int m = rowq[nq - 1] + 1 - i0 < 32 ? rowq[nq - 1] + 1 - i0 : 32; /* the last row sees the most */
                for (int i = 0; i < m; i++)
                    for (int d = 0; d < hd; d += 16)
                        _mm512_storeu_ps(vbuf + (size_t)i * hd + d, ld16(vh + (size_t)(n_old + i0 + i) * hd + d, hd - d));
                for (int j = 0, e; j < nq; j = e) { /* queries j .. e - 1: one row's */
                    for (e = j + 1; e < nq && rowq[e] == rowq[j]; e++) {}
                    const int cnt = rowq[j] + 1 - i0; /* its own slots from i0 on */
                    if (cnt <= 0) continue;
                    const float *pj[16];
                    float *oj[16];
                    for (int t = j; t < e; t++) pj[t - j] = sc + (size_t)t * (S + 16) + n_old + i0, oj[t - j] = oacc + (size_t)t * 256;
                    value_sum(pj, e - j, cnt < m ? cnt : m, vbuf, hd, oj);
                }
            }
        else
            for (int j = 0; j < nq; j++) {
                const int r = rowq[j], cnt = nslots[j] - n_old;
                for (int i0 = 0; i0 < cnt; i0 += 32) {
                    const int m = cnt - i0 < 32 ? cnt - i0 : 32;
                    for (int i = 0; i < m; i++)
                        for (int d = 0; d < hd; d += 16)
                            _mm512_storeu_ps(vbuf + (size_t)i * hd + d, ld16(vh + (size_t)SLOT(r, n_old + i0 + i) * hd + d, hd - d));
                    const float *pj = sc + (size_t)j * (S + 16) + n_old + i0;
                    float *oj = oacc + (size_t)j * 256;
                    value_sum(&pj, 1, m, vbuf, hd, &oj);
                }
            }
        for (int j = 0; j < nq; j++) {
            elem *orow = out + (size_t)rowq[j] * H * hd + (size_t)(hk * g + (q0 + j) % g) * hd;
            for (int d = 0; d < hd; d += 16) st16(orow + d, ldf(oacc + (size_t)j * 256 + d, hd - d), hd - d);
        }
#undef QPTR
#undef SLOT
    }
}

/* How many queries each task of sequence s takes (Att.qc): up to 16, halved while there would be
 * fewer than two tasks per thread. The outputs do not depend on it. */
static void attend_plan(int nseq, Att *A, int H, int Hk, int nthreads) {
    const int g = H / Hk;
    for (int s = 0; s < nseq; s++) {
        const int QN = A[s].T * g;
        int qc = QN < 16 ? QN : 16;
        while (qc > 1 && nseq * Hk * ((QN + qc - 1) / qc) < 2 * nthreads) qc = (qc + 1) / 2;
        A[s].qc = qc;
    }
}

/* Attention of nseq sequences (see attend_task) at one layer (K, Vv: each sequence's cache, layer
 * `layer` of (N, Hk, S, hd)) in one parallel loop: every (sequence, key/value head, chunk of
 * queries) is one task, so many short sequences cost one barrier, not one each. Each task
 * computes what it computes in a call of its sequence alone. scratch: ATTEND_SCRATCH(Smax)
 * floats per thread, Smax >= every sequence's S. */
static void attend_tasks(int nseq, const Att *A, int layer, int H, int Hk, int hd, float scale, int win, int Smax,
                         float *scratch) {
    const int g = H / Hk;
    int total = 0;
    for (int s = 0; s < nseq; s++) total += Hk * ((A[s].T * g + A[s].qc - 1) / A[s].qc);
#pragma omp for schedule(static)
    for (int t = 0; t < total; t++) {
        int s = 0, u = t, n;
        while (u >= (n = Hk * ((A[s].T * g + A[s].qc - 1) / A[s].qc))) u -= n, s++;
        Att a = A[s];
        const size_t off = (size_t)layer * Hk * a.S * hd;
        a.K += off, a.Vv += off;
        const int nqc = n / Hk;
        attend_task(&a, H, Hk, hd, scale, win, u / nqc, u % nqc, scratch + (size_t)omp_get_thread_num() * ATTEND_SCRATCH(Smax));
    }
}

/* One sequence's share of a call: its rows [row0, row0 + T) of the call's rows, attending its
 * own cache (keys, values: (N, Hk, S, hd), `start` slots committed). nanc (T,), anc (T, T): which
 * of its new rows each row attends (see attend); anc NULL: a chain (row r attends new rows 0..r). */
typedef struct {
    int row0, T, start, S;
    elem *keys, *values;
    const int *nanc, *anc;
} Seq;

/* The index of the first largest of v[0..V-1], as torch's argmax picks it; -1 where a NaN is */
static int argmax_row(const float *v, int V) {
    __m512 best = _mm512_set1_ps(-INFINITY);
    __m512i at = _mm512_setzero_si512(), idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 nan = 0;
    for (int c = 0; c < (V + 15) / 16; c++, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(16))) {
        const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m16(V - 16 * c), v + 16 * c);
        nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        const __mmask16 gt = _mm512_cmp_ps_mask(x, best, _CMP_GT_OQ); /* strictly: a lane keeps its first */
        best = _mm512_mask_mov_ps(best, gt, x);
        at = _mm512_mask_mov_epi32(at, gt, idx);
    }
    const __mmask16 top = _mm512_cmp_ps_mask(best, _mm512_set1_ps(_mm512_reduce_max_ps(best)), _CMP_EQ_OQ);
    return nan ? -1 : _mm512_mask_reduce_min_epi32(top, at);
}

/* The forward over the rows of nseq sequences at once (continuous batching): every matmul
 * reads each weight once for all rows; each sequence's rows attend only its own cache. By row
 * invariance (above) a row's outputs are what the sequence alone would compute, whatever else
 * shares the call.
 * x (T, D): the embedded rows in (sequence after sequence), the final normed rows out.
 * pos (T,): positions; cos, sin (T, hd): the rotary table there, sin with its first half negated.
 * feat_layers (nfeat,): layer indices whose input rows to copy to feats (nfeat, T, D) in that
 * order (index N: the final normed rows). logits (nlog, V) fp32 for rows log_rows[0..nlog-1]. */
void fused_forward_seqs(const Model *m, int nseq, const Seq *seqs, elem *x, int T, const int *pos,
                        const elem *cos, const elem *sin, int nfeat, const int *feat_layers, elem *feats,
                        int nlog, const int *log_rows, float *logits, int *argmax, int nthreads) {
    const int D = m->D, H = m->H, Hk = m->Hk, hd = m->hd, M = m->M;
    const int Q = (H + 2 * Hk) * hd;
    const int wide = Q > 2 * M ? Q : 2 * M;
    int Smax = 0;
    for (int s = 0; s < nseq; s++) Smax = seqs[s].S > Smax ? seqs[s].S : Smax;
    int *row_seq = malloc(sizeof(int) * (size_t)(T > 0 ? T : 1)); /* each row's sequence */
    for (int s = 0; s < nseq; s++)
        for (int r = 0; r < seqs[s].T; r++) row_seq[seqs[s].row0 + r] = s;
    float *y = malloc(sizeof(float) * (size_t)T * (wide > D ? wide : D));
    elem *h = malloc(sizeof(elem) * (size_t)T * (D > H * hd ? D : H * hd));
    elem *qb = malloc(sizeof(elem) * (size_t)T * H * hd);
    elem *ab = malloc(sizeof(elem) * (size_t)T * H * hd);
    elem *gb = malloc(sizeof(elem) * (size_t)T * M);
    elem *lx = malloc(sizeof(elem) * (size_t)(nlog > 0 ? nlog : 1) * D); /* the rows the LM head reads */
    float *scratch = malloc(sizeof(float) * (size_t)nthreads * ATTEND_SCRATCH(Smax));
    const int widest_in = D > M ? (D > H * hd ? D : H * hd) : (M > H * hd ? M : H * hd);
    const int nx = T > nlog ? T : nlog;
    elem *xv = malloc(sizeof(elem) * (size_t)((nx + 15) / 16 * 16) * widest_in);
    Att *att = malloc(sizeof(Att) * (size_t)nseq);
    for (int s = 0; s < nseq; s++) {
        const Seq *sq = &seqs[s];
        const Att a = {sq->keys, sq->values, sq->S, sq->T, sq->start, 0, pos + sq->row0, sq->nanc, sq->anc,
                       qb + (size_t)sq->row0 * H * hd, ab + (size_t)sq->row0 * H * hd};
        att[s] = a;
    }
    attend_plan(nseq, att, H, Hk, nthreads);
#pragma omp parallel num_threads(nthreads)
    {
        for (int l = 0; l < m->n_layers; l++) {
#pragma omp single
            for (int f = 0; f < nfeat; f++)
                if (feat_layers[f] == l) memcpy(feats + (size_t)f * T * D, x, sizeof(elem) * (size_t)T * D);
            /* attention */
            rms_norm(x, T, D, m->attn_norm[l], m->attn_eps[l], h);
            matmul(h, T, D, &m->wqkv[l], Q, y, xv);
            const elem *bq = m->bqkv[l];
            const size_t layer_off = (size_t)l * Hk; /* in (S, hd) planes */
#pragma omp for schedule(static) collapse(2)
            for (int r = 0; r < T; r++) {
                for (int hh = 0; hh < H + 2 * Hk; hh++) { /* one head of q, k or v: bias, RoPE, its place */
                    const Seq *sq = &seqs[row_seq[r]];
                    const size_t S = sq->S, slot = sq->start + (r - sq->row0);
                    elem *dst = hh < H ? qb + ((size_t)r * H + hh) * hd
                              : hh < H + Hk ? sq->keys + ((layer_off + hh - H) * S + slot) * hd
                                            : sq->values + ((layer_off + hh - H - Hk) * S + slot) * hd;
                    project_head(y + (size_t)r * Q + (size_t)hh * hd, bq ? bq + hh * hd : NULL, hd,
                                 hh < H + Hk && m->rope[l] ? cos + (size_t)r * hd : NULL, sin + (size_t)r * hd, dst);
                }
            }
            attend_tasks(nseq, att, l, H, Hk, hd, m->scale[l], m->window[l], Smax, scratch); /* each over its own cache */
            matmul(ab, T, H * hd, &m->wo[l], D, y, xv);
            residual(x, y, m->bo[l], T, D);
            /* MLP */
            rms_norm(x, T, D, m->mlp_norm[l], m->mlp_eps[l], h);
            matmul(h, T, D, &m->wgu[l], 2 * M, y, xv);
            swiglu(y, m->bgu[l], T, M, gb);
            matmul(gb, T, M, &m->wdown[l], D, y, xv);
            residual(x, y, m->bdown[l], T, D);
        }
        rms_norm(x, T, D, m->final_norm, m->final_eps, h);
#pragma omp single
        {
            memcpy(x, h, sizeof(elem) * (size_t)T * D);
            for (int f = 0; f < nfeat; f++)
                if (feat_layers[f] == m->n_layers) memcpy(feats + (size_t)f * T * D, x, sizeof(elem) * (size_t)T * D);
            for (int i = 0; i < nlog; i++) memcpy(lx + (size_t)i * D, x + (size_t)log_rows[i] * D, sizeof(elem) * D);
        }
        if (nlog > 0) {
            matmul(lx, nlog, D, &m->lm_w, m->V, logits, xv);
            const int V = m->V, chunks = (V + 15) / 16;
#ifdef FUSED_F32
            const int finish = m->lm_b != NULL; /* else the fp32 sums are the logits */
#else
            const int finish = 1;
#endif
            if (finish) { /* the same for every thread: all or none meet the loop */
#pragma omp for schedule(static) collapse(2)
                for (int r = 0; r < nlog; r++)
                    for (int c = 0; c < chunks; c++) /* elem logits (+ bias), kept as fp32, in place */
                        _mm512_mask_storeu_ps(logits + (size_t)r * V + 16 * c, m16(V - 16 * c),
                                              biased(logits + (size_t)r * V + 16 * c, m->lm_b ? m->lm_b + 16 * c : NULL, V - 16 * c));
            }
            if (argmax) { /* each row's first largest logit, as torch's argmax picks it; -1 where a NaN is */
#pragma omp for schedule(static)
                for (int r = 0; r < nlog; r++) argmax[r] = argmax_row(logits + (size_t)r * V, V);
            }
        }
    }
    free(xv); free(y); free(h); free(qb); free(ab); free(gb); free(lx); free(scratch); free(row_seq); free(att);
}

/* y (R, O) fp32 = x (R, I) @ w (O, I)^T: the forward's matmul alone (tests, measurements). */
void fused_matmul(const elem *x, int R, int I, const elem *w, int O, float *y, int nthreads) {
    elem *xv = malloc(sizeof(elem) * (size_t)((R + 15) / 16 * 16) * I);
#pragma omp parallel num_threads(nthreads)
    matmul_dense(x, R, I, w, O, y, xv);
    free(xv);
}

/* out (n, I) = rows ids[0..n-1] of one quantized part (an embedding table), each weight the
 * value the matmuls multiply by (deq32, rounded to the element type): a lookup without a dense
 * table, bit for bit what the dense table in the element type holds. */
void fused_rows(const Part *p, const int64_t *ids, int n, int I, elem *out) {
    for (int r = 0; r < n; r++) {
        const uint8_t *row = (const uint8_t *)p->data + (size_t)ids[r] * p->row_bytes;
        for (int g = 0; g < I / 32; g++) {
            __m512 lo, hi;
#ifndef FUSED_F32
            if (is_packed(p->type)) { /* the original block first: the same values */
                uint8_t blk[34];
                unpack_block(p, (int)ids[r], g, blk);
                deq32(blk, p->type & 0xff, 0, &lo, &hi);
            } else
#endif
            deq32(row, p->type, g, &lo, &hi);
            st16(out + (size_t)r * I + 32 * g, lo, 16);
            st16(out + (size_t)r * I + 32 * g + 16, hi, 16);
        }
    }
}

/* The same for a matrix of parts (dense or quantized): y (R, O) = x (R, I) @ w^T. */
void fused_qmatmul(const elem *x, int R, int I, const Mat *w, int O, float *y, int nthreads) {
    elem *xv = malloc(sizeof(elem) * (size_t)((R + 15) / 16 * 16) * I);
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
    const elem *norm_state, *norm_embed, *fc, *final_norm; /* fc (D, 2D) */
    const elem **norm_attn, **wq, **wo, **norm_mlp, **wgu, **wdown; /* per block */
    /* NULL, or the same matrices as blocks (q8: the head's weights packed, like the target's):
     * fc, then per block q, o, gate/up, down */
    const Mat *qfc, *qwq, *qwo, *qwgu, *qwdown;
} Head;

/* a head matrix: its blocks where the head has them (q), else the dense weights w */
static void head_matmul(const elem *x, int R, int I, const elem *w, const Mat *q, int O, float *y, elem *xv) {
    if (q) matmul(x, R, I, q, O, y, xv);
    else matmul_dense(x, R, I, w, O, y, xv);
}

/* R rows of nseq sequences (continuous batching: each sequence's rows [row0, row0 + T), all at
 * its position `start` = L with no ancestors; keys, values (Hk, S, hd): the target's layer the
 * head reads, slots 0..L-1 committed). state, emb (R, D): the states and the embedded tokens;
 * cos, sin (R, hd) per row (sin signed as above).
 * Out: state_out (R, D) and logits (R, V1 + Emax) fp32 (bf16 values) over w_vocab (V1, D; dense or quantized)
 * then the row's sequence's own w_extra[s] (E[s], D; Emax >= every E[s], zeros after a row's E[s]),
 * from the target's final norm of the new states. Every row is computed as it would be alone (row
 * invariance, above). */
void head_step_seqs(const Head *h, int nseq, const Seq *seqs, int R, const elem *state, const elem *emb,
                    const elem *cos, const elem *sin, const Mat *w_vocab, int V1,
                    const elem *const *w_extra, const int *E, int Emax, elem *state_out, float *logits, int nthreads) {
    const int D = h->D, H = h->H, hd = h->hd, M = h->M;
    int wide = 2 * D > 2 * M ? 2 * D : 2 * M;
    wide = wide > H * hd ? wide : H * hd;
    int Smax = 0;
    for (int s = 0; s < nseq; s++) Smax = seqs[s].S > Smax ? seqs[s].S : Smax;
    elem *u = malloc(sizeof(elem) * (size_t)R * wide), *n2 = malloc(sizeof(elem) * (size_t)R * 2 * D);
    elem *q = malloc(sizeof(elem) * (size_t)R * H * hd), *a = malloc(sizeof(elem) * (size_t)R * H * hd);
    float *y = malloc(sizeof(float) * (size_t)R * wide);
    size_t *l2off = malloc(sizeof(size_t) * (size_t)(nseq + 1)); /* sequence s's extra logits: T_s x E[s] from l2off[s] */
    l2off[0] = 0;
    for (int s = 0; s < nseq; s++) l2off[s + 1] = l2off[s] + (size_t)seqs[s].T * E[s];
    float *l1 = malloc(sizeof(float) * (size_t)R * V1), *l2 = malloc(sizeof(float) * (l2off[nseq] + 1));
    elem *xv = malloc(sizeof(elem) * (size_t)((R + 15) / 16 * 16) * wide);
    float *scratch = malloc(sizeof(float) * (size_t)nthreads * ATTEND_SCRATCH(Smax));
    int *pos = malloc(sizeof(int) * R), *none = calloc(R, sizeof(int)), *row_seq = malloc(sizeof(int) * R);
    for (int s = 0; s < nseq; s++)
        for (int r = 0; r < seqs[s].T; r++) pos[seqs[s].row0 + r] = seqs[s].start, row_seq[seqs[s].row0 + r] = s;
    /* every committed slot, no new rows: each row at "start" L with no ancestors */
    Att *att = malloc(sizeof(Att) * (size_t)nseq);
    for (int s = 0; s < nseq; s++) {
        const Seq *sq = &seqs[s];
        const Att at = {sq->keys, sq->values, sq->S, sq->T, sq->start, 0, pos + sq->row0, none, none,
                        q + (size_t)sq->row0 * H * hd, a + (size_t)sq->row0 * H * hd};
        att[s] = at;
    }
    attend_plan(nseq, att, H, h->Hk, nthreads);
    elem *x = state_out; /* written by the fc step first */
#pragma omp parallel num_threads(nthreads)
    {
        rms_norm(state, R, D, h->norm_state, h->eps, n2); /* u = [norm(state); norm(emb)] (R, 2D) */
        rms_norm(emb, R, D, h->norm_embed, h->eps, n2 + (size_t)R * D);
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            memcpy(u + (size_t)r * 2 * D, n2 + (size_t)r * D, sizeof(elem) * D);
            memcpy(u + (size_t)r * 2 * D + D, n2 + (size_t)(R + r) * D, sizeof(elem) * D);
        }
        head_matmul(u, R, 2 * D, h->fc, h->qfc, D, y, xv);
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++)
            for (int d = 0; d < D; d += 16) st16(x + (size_t)r * D + d, ldf(y + (size_t)r * D + d, D - d), D - d);
        for (int b = 0; b < h->n_blocks; b++) {
            rms_norm(x, R, D, h->norm_attn[b], h->eps, u);
            head_matmul(u, R, D, h->wq[b], h->qwq ? h->qwq + b : NULL, H * hd, y, xv);
#pragma omp for schedule(static) collapse(2)
            for (int r = 0; r < R; r++)
                for (int hh = 0; hh < H; hh++)
                    project_head(y + ((size_t)r * H + hh) * hd, NULL, hd, cos + (size_t)r * hd, sin + (size_t)r * hd,
                                 q + ((size_t)r * H + hh) * hd);
            attend_tasks(nseq, att, 0, H, h->Hk, hd, 1.0f / sqrtf((float)hd), 0, Smax, scratch);
            head_matmul(a, R, H * hd, h->wo[b], h->qwo ? h->qwo + b : NULL, D, y, xv);
            residual(x, y, NULL, R, D);
            if (M > 0) {
                rms_norm(x, R, D, h->norm_mlp[b], h->eps, u);
                head_matmul(u, R, D, h->wgu[b], h->qwgu ? h->qwgu + b : NULL, 2 * M, y, xv);
                swiglu(y, NULL, R, M, u); /* u now holds the gate products (R, M) */
                head_matmul(u, R, M, h->wdown[b], h->qwdown ? h->qwdown + b : NULL, D, y, xv);
                residual(x, y, NULL, R, D);
            }
        }
        rms_norm(x, R, D, h->final_norm, h->final_eps, u);
        matmul(u, R, D, w_vocab, V1, l1, xv);
        for (int s = 0; s < nseq; s++) /* each sequence's own extra rows (the same for every thread) */
            if (E[s] > 0) matmul_dense(u + (size_t)seqs[s].row0 * D, seqs[s].T, D, w_extra[s], E[s], l2 + l2off[s], xv);
        const int V = V1 + Emax;
#pragma omp for schedule(static) collapse(2)
        for (int r = 0; r < R; r++)
            for (int i = 0; i < V; i += 16) { /* both parts, rounded to bf16, side by side; 0 past a row's own E */
                const int sr = row_seq[r], Es = E[sr];
                const float *e = l2 + l2off[sr] + (size_t)(r - seqs[sr].row0) * Es;
                float t[16];
                for (int j = 0; j < 16; j++) t[j] = i + j < V1 ? l1[(size_t)r * V1 + i + j] : i + j < V1 + Es ? e[i + j - V1] : 0.0f;
                _mm512_mask_storeu_ps(logits + (size_t)r * V + i, m16(V - i), rb16(_mm512_loadu_ps(t)));
            }
    }
    free(u); free(n2); free(q); free(a); free(y); free(l1); free(l2); free(xv); free(scratch); free(pos); free(none); free(att); free(row_seq); free(l2off);
}

/* One embedding row (dense in the element type, or quantized / packed blocks) into out (I,) */
static void embed_row(const Part *p, int64_t id, int I, elem *out) {
    if (p->type == Q_DENSE)
        memcpy(out, (const uint8_t *)p->data + (size_t)id * p->row_bytes, sizeof(elem) * I);
    else
        fused_rows(p, &id, 1, I, out);
}

/* A greedy chain of k drafts of one sequence as one call: head_step_seqs for one row, k times,
 * each step's token the first largest of its logits (torch's argmax) over the draft vocabulary
 * then w_extra's E rows, mapped to a token id by ids (V1 + E; NULL: the index is the id), and
 * looked up in the target's embedding for the next step. The same calls and values the step-by-
 * step path makes, without returning to Python between steps. state (D): the start state;
 * tok: the token at the sequence's position; cos, sin (k, hd): the rows for its k positions.
 * Returns 0, or -1 where a step's logits hold a NaN (the caller decides those steps itself). */
/* Greedy chains of nseq sequences as one call (continuous batching): sequence s (seqs[s], T = 1,
 * its cache at its length) drafts ks[s] tokens from its state (row s of state (nseq, D)) and
 * token toks[s], with its rotary rows cos[s], sin[s] (ks[s], hd), its vocabulary ids[s] (V1 +
 * E[s],) or NULL (the whole vocabulary) and extra rows w_extra[s] (E[s], D). Depth j is one
 * head_step_seqs over the sequences with ks[s] > j, in order; each row's token is the first
 * largest of its own V1 + E[s] logits. Row invariance: each sequence gets what its own chain
 * (nseq = 1) gives. out[s * kmax + j]; -1 where a step's logits hold a NaN. */
int head_chain_seqs(const Head *h, int nseq, const Seq *seqs, const int *ks, const elem *state, const int64_t *toks,
                    const elem *const *cos, const elem *const *sin, const Mat *w_vocab, int V1,
                    const int64_t *const *ids, const elem *const *w_extra, const int *E, const Part *embed,
                    int64_t *out, int kmax, int nthreads) {
    const int D = h->D, hd = h->hd;
    int Emax = 0;
    for (int s = 0; s < nseq; s++) Emax = E[s] > Emax ? E[s] : Emax;
    elem *st = malloc(sizeof(elem) * (size_t)nseq * D), *x = malloc(sizeof(elem) * (size_t)nseq * D);
    elem *emb = malloc(sizeof(elem) * (size_t)nseq * D), *next = malloc(sizeof(elem) * (size_t)nseq * D);
    elem *cb = malloc(sizeof(elem) * (size_t)nseq * hd), *sb = malloc(sizeof(elem) * (size_t)nseq * hd);
    float *logits = malloc(sizeof(float) * (size_t)nseq * (V1 + Emax));
    Seq *live = malloc(sizeof(Seq) * (size_t)nseq);
    int *at = malloc(sizeof(int) * (size_t)nseq), *El = malloc(sizeof(int) * (size_t)nseq);
    const elem **wl = malloc(sizeof(elem *) * (size_t)nseq);
    int64_t *tok = malloc(sizeof(int64_t) * (size_t)nseq);
    memcpy(st, state, sizeof(elem) * (size_t)nseq * D);
    memcpy(tok, toks, sizeof(int64_t) * (size_t)nseq);
    int rc = 0;
    for (int j = 0; j < kmax && rc == 0; j++) {
        int R = 0, Em = 0;
        for (int s = 0; s < nseq; s++) {
            if (ks[s] <= j) continue;
            live[R] = seqs[s];
            live[R].row0 = R, live[R].T = 1;
            at[R] = s, El[R] = E[s], wl[R] = w_extra[s];
            Em = E[s] > Em ? E[s] : Em;
            memcpy(x + (size_t)R * D, st + (size_t)s * D, sizeof(elem) * D);
            embed_row(embed, tok[s], D, emb + (size_t)R * D);
            memcpy(cb + (size_t)R * hd, cos[s] + (size_t)j * hd, sizeof(elem) * hd);
            memcpy(sb + (size_t)R * hd, sin[s] + (size_t)j * hd, sizeof(elem) * hd);
            R++;
        }
        if (R == 0) break;
        head_step_seqs(h, R, live, R, x, emb, cb, sb, w_vocab, V1, wl, El, Em, next, logits, nthreads);
        for (int r = 0; r < R && rc == 0; r++) {
            const int s = at[r], best = argmax_row(logits + (size_t)r * (V1 + Em), V1 + El[r]);
            if (best < 0) rc = -1;
            else out[(size_t)s * kmax + j] = tok[s] = ids[s] ? ids[s][best] : best;
            memcpy(st + (size_t)s * D, next + (size_t)r * D, sizeof(elem) * D);
        }
    }
    free(st); free(x); free(emb); free(next); free(cb); free(sb); free(logits);
    free(live); free(at); free(El); free(wl); free(tok);
    return rc;
}

#ifndef FUSED_F32
/* quant.pack in C: O rows of a Q4_0 / Q4_1 / Q8_0 matrix (GGML type qt, blocks as the file stores
 * them, row_bytes each) -> (ceil(O / 16), I / 32 * pblk) bytes in matmul_q8's layout (see there);
 * rows past O packed as zero blocks: quant.pack's bytes. */
void fused_pack(const uint8_t *src, int qt, int O, int I, long row_bytes, uint8_t *dst) {
    const int G = I / 32, C = (O + 15) / 16, pt = 0x100 + qt, B = pblk(pt), q0 = qt == Q_4_1 ? 4 : 2;
    const int bb = qt == Q_8_0 ? 34 : qt == Q_4_1 ? 20 : 18; /* bytes per file block */
    static const uint8_t zero[34] = {0};
    memset(dst, 0, (size_t)C * G * B);
    for (int o = 0; o < 16 * C; o++) { /* rows past O: zero blocks, as numpy's pack pads */
        const int c = o / 16, n = o % 16;
        for (int g = 0; g < G; g++) {
            const uint8_t *blk = o < O ? src + (size_t)o * row_bytes + (size_t)bb * g : zero;
            uint8_t *cell = dst + ((size_t)c * G + g) * B;
            if (qt == Q_8_0) {
                memcpy(cell + 512 + 2 * n, blk, 2);
                for (int k = 0; k < 32; k++) cell[64 * (k / 4) + 4 * n + k % 4] = blk[2 + k] ^ 0x80;
                continue;
            }
            memcpy(cell + 256 + 2 * n, blk, 2);
            if (qt == Q_4_1) memcpy(cell + 288 + 2 * n, blk + 2, 2);
            for (int k = 0; k < 32; k++) {
                const int u = k < 16 ? blk[q0 + k] & 15 : blk[q0 + k - 16] >> 4; /* weight k */
                cell[64 * (k / 8) + 4 * n + k % 4] |= (uint8_t)(u << (4 * (k / 4 % 2)));
            }
        }
    }
}
#endif
