// cuda_emu.cc — the block scheduler behind tests/cuda/emu's cuda_runtime.h: a block's
// threads are coroutines on the calling thread; each runs until it reaches a barrier or
// returns, and when every live thread of the block waits at the barrier they are all
// released (exited threads do not count, as on the device). Blocks run in order.
// The switch is a few lines of x86-64 assembly (callee-saved registers and the stack
// pointer): ucontext's swapcontext makes a signal-mask system call per switch, which made
// the op tests take half a minute of CPU.
#include "cuda_runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <vector>

loom_emu_idx loom_emu_thread, loom_emu_block;
dim3 loom_emu_block_dim, loom_emu_grid_dim;

// emu_switch(save, to): push the callee-saved registers, store the stack pointer in
// *save, load `to`, pop that coroutine's registers and return into it.
extern "C" void emu_switch(void **save, void *to);
asm(".text\n.globl emu_switch\n.type emu_switch,@function\nemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n.size emu_switch, .-emu_switch\n");

namespace {
enum { STACK = 128 * 1024, MAX_THREADS = 1024 };
struct coro {
    void *sp;
    char *stack;
    int done;
    loom_emu_idx idx;
};
std::vector<coro> threads;
void *scheduler_sp;
int current;
std::function<void()> *body;
int or_acc;

unsigned block_threads, live; // the running block's threads, and those not yet returned

// From the running thread (at a barrier, or returned): straight on to the next thread of
// this pass that has not returned, or back to the scheduler after the last (one switch
// per thread and barrier, not two through the scheduler).
void pass_on(void **save)
{
    unsigned j = (unsigned)current + 1;
    while (j < block_threads && threads[j].done)
        j++;
    if (j == block_threads) {
        emu_switch(save, scheduler_sp);
        return;
    }
    current = (int)j;
    loom_emu_thread = threads[j].idx;
    if (j + 2 < block_threads) { /* the next ones: their saved registers on their way (PF) */
        __builtin_prefetch(threads[j + 2].sp);
        __builtin_prefetch((char *)threads[j + 2].sp + 56);
    }
    emu_switch(save, threads[j].sp);
}

[[noreturn]] void trampoline()
{
    (*body)();
    threads[current].done = 1;
    live--;
    void *dead;
    pass_on(&dead); // never resumed
    abort();
}

// A fresh stack that emu_switch "returns" into trampoline from: six zeroed registers, the
// entry address, and one slot so that the entry sees the stack as after a call. Thread i's
// top is moved down by (i mod 64) cache lines: the stacks are separate page-aligned
// allocations, so equal tops would all fall in the same cache sets and every switch
// would miss (measured: most of the emulation's time went to the switches).
void *fresh_stack(char *stack, unsigned i)
{
    uintptr_t top = ((uintptr_t)(stack + STACK - (i % 64) * 64)) & ~(uintptr_t)15;
    void **sp = (void **)(top - 64);
    for (int i = 0; i < 6; i++)
        sp[i] = nullptr;
    sp[6] = (void *)&trampoline;
    sp[7] = nullptr;
    return sp;
}

int direct;             // this launch's blocks run by plain calls (loom_emu_launch)
unsigned long barriers; // barriers reached in the block running as coroutines

void yield_to_scheduler()
{
    if (direct) {
        fprintf(stderr, "cuda emu: thread %d of block (%u,%u,%u) reached a barrier in a launch "
                "whose first block reached none: not emulated (tests/cuda/emu/cuda_emu.cc)\n",
                current, loom_emu_block.x, loom_emu_block.y, loom_emu_block.z);
        abort();
    }
    barriers++;
    pass_on(&threads[current].sp);
}
} // namespace

void __syncthreads(void)
{
    yield_to_scheduler();
}

int __syncthreads_or(int pred)
{
    if (pred)
        or_acc = 1;
    __syncthreads();
    int r = or_acc;
    __syncthreads();
    if (current == 0)
        or_acc = 0;
    __syncthreads();
    return r;
}

// The shuffles exchange through slot[parity]: one barrier each, not two. A thread's k-th
// exchange writes buffer k % 2 after the barrier of its (k-1)-th, which every thread
// passes only after reading exchange k-2 from that buffer, so no value is overwritten
// while it may still be read. Every thread of a block makes the same exchanges (the
// barrier is the block's, as it always was here).
// A warp's reduction result is computed once, by the first of its lanes to resume, into
// result[parity] (read under the same argument as slot); stamp says for which exchange
// (a thread's count of exchanges in this block, from 1).
namespace {
double slot[2][MAX_THREADS], result[2][MAX_THREADS];
unsigned exchanges[MAX_THREADS], stamp[2][MAX_THREADS / 32];
double *exchange(double v)
{
    double *s = slot[exchanges[current]++ & 1];
    s[current] = v;
    __syncthreads();
    return s;
}
} // namespace

double loom_emu_shfl_xor(double v, int o)
{
    return exchange(v)[current ^ o];
}

const double *loom_emu_warp_values(double v, int *lane, double **out, int *first)
{
    const double *w = exchange(v) + (current & ~31);
    const unsigned k = exchanges[current], p = k & 1, warp = (unsigned)current / 32;
    *lane = current & 31;
    *out = result[p] + (current & ~31);
    *first = stamp[p][warp] != k;
    stamp[p][warp] = k;
    return w;
}

// Blocks whose threads reach no barrier need no coroutines: when the launch's first block
// ran to its end without one, the others run each thread to completion by a plain call,
// in the same order (so the same bits). A barrier reached in such a block after all (a
// kernel whose first block skips what later ones synchronise) is not emulated: it stops
// the program, named, rather than run wrong.
void loom_emu_launch(dim3 grid, dim3 block, std::function<void()> fn)
{
    const unsigned n = block.x * block.y * block.z;
    if (n == 0 || n > MAX_THREADS) {
        fprintf(stderr, "cuda emu: %u threads per block\n", n);
        abort();
    }
    if (threads.size() < n) {
        size_t had = threads.size();
        threads.resize(n);
        /* mapped, not malloc'd: only the pages a thread uses are touched (MALLOC_PERTURB_,
         * which meson test sets, fills a malloc'd stack whole: 128 MiB at 1024 threads, most
         * of cuda_dp_emu's system time); the new threads' stacks one mapping, not one each */
        char *st = (char *)mmap(NULL, (n - had) * STACK, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (st == (char *)MAP_FAILED) {
            fprintf(stderr, "cuda emu: no memory for threads %zu-%u's stacks\n", had, n - 1);
            abort();
        }
        madvise(st, (n - had) * STACK, MADV_NOHUGEPAGE); /* 4 KiB pages, as 128 KiB maps had:
                                                          * a huge page would be zeroed whole */
        for (size_t i = had; i < n; i++)
            threads[i].stack = st + (i - had) * STACK;
    }
    loom_emu_grid_dim = grid;
    loom_emu_block_dim = block;
    body = &fn;
    for (unsigned i = 0; i < n; i++)
        threads[i].idx = {i % block.x, i / block.x % block.y, i / (block.x * block.y)};
    direct = 0;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                loom_emu_block = {bx, by, bz};
                if (direct) {
                    for (unsigned i = 0; i < n; i++) {
                        current = (int)i;
                        loom_emu_thread = threads[i].idx;
                        fn();
                    }
                    continue;
                }
                or_acc = 0;
                barriers = 0;
                memset(exchanges, 0, n * sizeof *exchanges);
                memset(stamp, 0, sizeof stamp);
                for (unsigned i = 0; i < n; i++) {
                    if (i + 4 < n) /* PF */
                        __builtin_prefetch(threads[i + 4].stack + STACK - 64 - ((i + 4) % 64) * 64, 1);
                    threads[i].done = 0;
                    threads[i].sp = fresh_stack(threads[i].stack, i);
                }
                block_threads = n;
                for (live = n; live > 0;) { // one pass: every thread to its next barrier, in order
                    unsigned i = 0;
                    while (threads[i].done)
                        i++;
                    current = (int)i;
                    loom_emu_thread = threads[i].idx;
                    emu_switch(&scheduler_sp, threads[i].sp); /* back after the pass's last */
                }
                direct = barriers == 0;
            }
    direct = 0;
}
