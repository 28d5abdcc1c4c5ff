/* A streaming read for `mtpspec costs` (bandwidth.py): every byte of a buffer read once, front to
 * back, by `threads` threads, each its own contiguous share. The words are summed so the reads
 * cannot be optimised away; integer adds vectorise without reassociating floating point, so at
 * -O3 the loop is wide loads and adds, bound by memory, not arithmetic. */
#include <stdint.h>

uint64_t stream_read(const uint64_t *x, long n, int threads) {
    uint64_t total = 0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (long i = 0; i < n; i++) total += x[i];
    return total;
}
