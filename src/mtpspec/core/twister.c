/* torch.multinomial(p, 1, generator) on the CPU, draw for draw, computing only what can win.
 *
 * torch (aten/src/ATen/native/Distributions.cpp, one sample) draws q ~ Exp(1) for every token and
 * returns argmax(p / q). Each q is -log1p(-u), u the low 53 bits of random64() over 2^53, where
 * random64() is two outputs of the generator's Mersenne Twister (the first the high word), and
 * q is rounded to float32; p / q is a float32 division; argmax takes the first maximum. A token
 * with p = 0 cannot win (0 / q = 0) unless its u is 0 (q = 0, 0 / 0 = NaN, which argmax picks), so
 * here the twister runs over every token (two words each, as torch's does) but only the tokens
 * with p > 0 get their variate; a zero u anywhere hands the draw back to torch.
 *
 * The twister is torch's at::mt19937 (aten/src/ATen/core/MT19937RNGEngine.h): 624 state words,
 * `pos` the next word to read, a twist of the whole state when it reaches 624.
 */
#include <math.h>
#include <stdint.h>

#define MT_N 624
#define MT_M 397

static inline uint32_t twist(uint32_t u, uint32_t v) {
    return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

static void next_state(uint32_t *s) {
    int j = 0;
    for (; j < MT_N - MT_M; j++) s[j] = s[j + MT_M] ^ twist(s[j], s[j + 1]);
    for (; j < MT_N - 1; j++) s[j] = s[j + MT_M - MT_N] ^ twist(s[j], s[j + 1]);
    s[MT_N - 1] = s[MT_M - 1] ^ twist(s[MT_N - 1], s[0]);
}

static inline uint32_t temper(uint32_t y) {
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* One draw per row of p (n rows of v tokens, float32, row after row as torch draws them) from
 * the twister state s (624 words) at *pos; picks[r] the token of row r. Returns 0, with s and *pos
 * advanced past 2 * n * v words; or -1 (p negative or not finite, a row without a positive ratio,
 * a zero u) with s and *pos meaningless: the caller then lets torch draw from its own state. */
int mt_multinomial(uint32_t *s, int *pos, const float *p, long n, long v, long *picks) {
    int at = *pos;
    for (long r = 0; r < n; r++) {
        const float *pr = p + r * v;
        float best = 0.0f;
        long pick = -1;
        for (long t = 0; t < v; t++) {
            if (at == MT_N) next_state(s), at = 0;
            const uint32_t hi = s[at++];
            if (at == MT_N) next_state(s), at = 0;
            const uint32_t lo = s[at++];
            const float pt = pr[t];
            if (!(pt >= 0.0f) || isinf(pt)) return -1;  /* negative, NaN or inf: torch raises */
            if (pt == 0.0f) {
                if (lo == 0 && (temper(hi) & 0x1fffffu) == 0) return -1; /* u = 0: temper(0) = 0 */
                continue;
            }
            const uint64_t mant = (((uint64_t)temper(hi) << 32) | temper(lo)) & ((1ull << 53) - 1);
            if (mant == 0) return -1;
            const double u = (double)mant * (1.0 / 9007199254740992.0);
            const float q = (float)(-log1p(-u));
            const float ratio = pt / q;
            if (ratio > best) best = ratio, pick = t;
        }
        if (pick < 0) return -1;
        picks[r] = pick;
    }
    *pos = at;
    return 0;
}
