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
double slot[MAX_THREADS];
int or_acc;

[[noreturn]] void trampoline()
{
    (*body)();
    threads[current].done = 1;
    void *dead;
    emu_switch(&dead, scheduler_sp); // never resumed
    abort();
}

// A fresh stack that emu_switch "returns" into trampoline from: six zeroed registers, the
// entry address, and one slot so that the entry sees the stack as after a call.
void *fresh_stack(char *stack)
{
    uintptr_t top = ((uintptr_t)(stack + STACK)) & ~(uintptr_t)15;
    void **sp = (void **)(top - 64);
    for (int i = 0; i < 6; i++)
        sp[i] = nullptr;
    sp[6] = (void *)&trampoline;
    sp[7] = nullptr;
    return sp;
}

void yield_to_scheduler()
{
    emu_switch(&threads[current].sp, scheduler_sp);
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

double loom_emu_shfl_xor(double v, int o)
{
    slot[current] = v;
    __syncthreads();
    double r = slot[current ^ o];
    __syncthreads();
    return r;
}

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
        for (size_t i = had; i < n; i++)
            threads[i].stack = (char *)malloc(STACK);
    }
    loom_emu_grid_dim = grid;
    loom_emu_block_dim = block;
    body = &fn;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                loom_emu_block = {bx, by, bz};
                or_acc = 0;
                for (unsigned i = 0; i < n; i++) {
                    coro &c = threads[i];
                    c.done = 0;
                    c.idx = {i % block.x, i / block.x % block.y, i / (block.x * block.y)};
                    c.sp = fresh_stack(c.stack);
                }
                for (unsigned live = n; live > 0;) { // one pass: every thread to its next barrier
                    live = 0;
                    for (unsigned i = 0; i < n; i++) {
                        if (threads[i].done)
                            continue;
                        current = (int)i;
                        loom_emu_thread = threads[i].idx;
                        emu_switch(&scheduler_sp, threads[i].sp);
                        live += !threads[i].done;
                    }
                }
            }
}
