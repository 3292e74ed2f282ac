/* The CUDA execution model on one CPU thread: blocks one after another, the threads of a block as
 * fibers that run until they reach __syncthreads (a block barrier), a warp shuffle (a warp
 * barrier) or their end. Deterministic; a block where no fiber can go on is a deadlock, reported
 * through emu_launch's error string. Fibers start with makecontext and then switch with GCC's
 * __builtin_setjmp/__builtin_longjmp: a few instructions, where swapcontext makes a signal-mask
 * system call and _longjmp unwinds cleanup handlers. */
#include "cuda_emu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <mutex>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

extern "C" const emu::Kernel emu_kernels[]; /* the module's table, generated with its source */
extern "C" char __start_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_emu_shared[] __attribute__((weak, visibility("hidden")));

namespace emu {
uint3 thread_idx, block_idx;
dim3 block_dim, grid_dim;

namespace {
enum State { READY, AT_SYNC, AT_SHUFFLE, DONE };

constexpr size_t STACK = 256 << 10;
constexpr unsigned MAX_THREADS = 1024;

typedef void* Jump[5];

/* apart from the __builtin_setjmp it returns to, as GCC requires */
__attribute__((noinline, noreturn)) void jump(Jump to) { __builtin_longjmp(to, 1); }

struct Fiber {
    Jump jb;
    ucontext_t start; /* holds a pointer into itself: Fibers never move */
    char* stack;
    bool fresh;       /* must (re)start from the entry point: new, or abandoned mid-kernel */
    State state;
    uint3 tid;
    ShuffleKind kind; /* the shuffle it waits at, its operand and the value it gives */
    int arg, width;
    uint64_t bits;
    void* fake_stack; /* AddressSanitizer's, across switches */
};

Fiber fibers[MAX_THREADS];
Fiber* cur;
Jump scheduler;
const Kernel* kernel;
void** kernel_args;
bool reverse = getenv("CUDA_EMU_REVERSE") != nullptr;
char error[1024];
bool failed;
std::mutex launching; /* ctypes drops the GIL: one launch at a time */
#if EMU_ASAN
void* scheduler_fake_stack;
const void* scheduler_bottom;
size_t scheduler_size;
#endif

void set_error(const char* fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int const n = snprintf(error, sizeof error, "%s, block (%u,%u,%u): ", kernel->name, block_idx.x, block_idx.y, block_idx.z);
    vsnprintf(error + n, sizeof error - n, fmt, ap);
    va_end(ap);
    failed = true;
}

/* from the current fiber to the scheduler; returns when the scheduler resumes the fiber.
 * noipa: its callers must not keep values in registers it seems to leave alone (-fipa-ra), since
 * it returns with the registers of another stack's jump. Likewise resume. */
__attribute__((noipa)) void yield(State s)
{
    Fiber* const f = cur;
    f->state = s;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&f->fake_stack, scheduler_bottom, scheduler_size);
#endif
    if (!__builtin_setjmp(f->jb)) jump(scheduler);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f->fake_stack, &scheduler_bottom, &scheduler_size);
#endif
}

/* a fiber runs the kernel once per block; between blocks and launches it waits at its end */
void entry()
{
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_bottom, &scheduler_size);
#endif
    for (;;) {
        kernel->call(kernel_args);
        yield(DONE);
    }
}

__attribute__((noipa)) void resume(Fiber& f)
{
    cur = &f;
    thread_idx = f.tid;
    if (f.fresh) {
        if (!f.stack) {
            /* a guard page below the stack: an overflow faults instead of corrupting memory */
            long const page = sysconf(_SC_PAGESIZE);
            void* const m = mmap(nullptr, STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) abort();
            mprotect(m, page, PROT_NONE);
            f.stack = static_cast<char*>(m) + page;
        }
#if EMU_ASAN
        __asan_unpoison_memory_region(f.stack, STACK); /* left poisoned by abandoned frames */
#endif
        getcontext(&f.start);
        f.start.uc_stack.ss_sp = f.stack;
        f.start.uc_stack.ss_size = STACK;
        f.start.uc_link = nullptr;
        makecontext(&f.start, entry, 0);
    }
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&scheduler_fake_stack, f.stack, STACK);
#endif
    if (!__builtin_setjmp(scheduler)) {
        if (f.fresh) {
            f.fresh = false;
            setcontext(&f.start);
        }
        jump(f.jb);
    }
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(scheduler_fake_stack, nullptr, nullptr);
#endif
}

/* every lane of the warp that is still running waits at a shuffle: answer them all, from the
 * values as they were deposited, before any of them goes on */
bool exchange(Fiber* lanes, unsigned n)
{
    uint64_t out[32];
    Fiber const* first = nullptr;
    for (unsigned i = 0; i < n; i++) {
        Fiber const& f = lanes[i];
        if (f.state != AT_SHUFFLE) continue;
        if (!first) first = &f;
        if (f.kind != first->kind || f.width != first->width) {
            set_error("the lanes of warp %u wait at different shuffles", (unsigned)(&f - fibers) / 32);
            return false;
        }
        int const w = f.width, seg = (int)i & ~(w - 1);
        int src = (int)i;
        switch (f.kind) {
        case SHFL_IDX: src = seg + (f.arg & (w - 1)); break;
        case SHFL_UP: src = ((int)i & (w - 1)) >= f.arg ? (int)i - f.arg : (int)i; break;
        case SHFL_DOWN: src = ((int)i & (w - 1)) + f.arg < w ? (int)i + f.arg : (int)i; break;
        case SHFL_XOR: src = ((int)i ^ f.arg) < seg + w ? (int)i ^ f.arg : (int)i; break;
        }
        /* CUDA leaves the value undefined when the source lane does not take part */
        if (src >= (int)n || lanes[src].state != AT_SHUFFLE) {
            set_error("thread %u reads lane %d of its warp in a shuffle, which %s", (unsigned)(&f - fibers), src,
                      src >= (int)n ? "does not exist (a partial warp)" : "has returned");
            return false;
        }
        out[i] = lanes[src].bits;
    }
    for (unsigned i = 0; i < n; i++)
        if (lanes[i].state == AT_SHUFFLE) {
            lanes[i].bits = out[i];
            lanes[i].state = READY;
        }
    return true;
}

/* undefined at the start of a block, as on a GPU. Across AddressSanitizer's redzones between the
 * variables too: uninstrumented, and byte by byte (its memset would check). */
__attribute__((no_sanitize_address)) void poison_shared()
{
    for (volatile char* p = __start_emu_shared; p < __stop_emu_shared; p++) *p = (char)0xff;
}

bool run_block(unsigned n)
{
    unsigned live = n, at_sync = 0, warp_live[MAX_THREADS / 32] = {}, at_shuffle[MAX_THREADS / 32] = {};
    for (unsigned i = 0; i < n; i++) {
        fibers[i].state = READY;
        warp_live[i / 32]++;
    }
    poison_shared();
    for (;;) {
        bool ran = false;
        for (unsigned k = 0; k < n; k++) {
            unsigned const i = reverse ? n - 1 - k : k;
            Fiber& f = fibers[i];
            if (f.state != READY) continue;
            ran = true;
            resume(f);
            if (failed) return false;
            unsigned const w = i / 32;
            if (f.state == AT_SYNC) at_sync++;
            else if (f.state == AT_SHUFFLE) at_shuffle[w]++;
            else if (f.state == DONE) live--, warp_live[w]--;
            if (at_sync && at_sync == live) { /* exited threads no longer count, as on sm_70+ */
                for (unsigned j = 0; j < n; j++)
                    if (fibers[j].state == AT_SYNC) fibers[j].state = READY;
                at_sync = 0;
            }
            if (at_shuffle[w] && at_shuffle[w] == warp_live[w]) {
                unsigned const first = w * 32;
                if (!exchange(fibers + first, n - first < 32 ? n - first : 32)) return false;
                at_shuffle[w] = 0;
            }
        }
        if (!live) return true;
        if (!ran) {
            unsigned shuffling = 0;
            for (unsigned w = 0; w < (n + 31) / 32; w++) shuffling += at_shuffle[w];
            set_error("deadlock: %u threads wait at __syncthreads, %u at a shuffle, %u have returned "
                      "(a barrier in divergent code?)", at_sync, shuffling, n - live);
            return false;
        }
    }
}
} // namespace

void sync_threads() { yield(AT_SYNC); }

uint64_t shuffle(ShuffleKind kind, unsigned mask, uint64_t bits, int arg, int width)
{
    Fiber* const f = cur;
    if (mask != 0xffffffffu || width < 1 || width > 32 || (width & (width - 1))) {
        set_error("shuffle with mask 0x%x, width %d: the emulator takes full warps and widths of 1..32, powers of two",
                  mask, width);
#if EMU_ASAN
        __sanitizer_start_switch_fiber(nullptr, scheduler_bottom, scheduler_size);
#endif
        jump(scheduler);
    }
    f->kind = kind;
    f->arg = arg;
    f->width = width;
    f->bits = bits;
    yield(AT_SHUFFLE);
    return f->bits;
}
} // namespace emu

using namespace emu;

extern "C" const char* emu_signature(const char* name)
{
    for (const Kernel* k = emu_kernels; k->name; k++)
        if (!strcmp(k->name, name)) return k->signature();
    return nullptr;
}

/* args[i] points at the value of parameter i, of its exact type (checked by the caller).
 * Returns 0, or 1 with the reason in err. */
extern "C" int emu_launch(const char* name, void** args, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, char* err, size_t errlen)
{
    std::lock_guard<std::mutex> lock(launching);
    kernel = nullptr;
    for (const Kernel* k = emu_kernels; k->name; k++)
        if (!strcmp(k->name, name)) kernel = k;
    unsigned const n = bx * by * bz;
    if (!kernel || !n || n > MAX_THREADS || n > kernel->max_threads) {
        snprintf(err, errlen, "%s: %s", name, !kernel ? "no such kernel" : "too many resources requested for launch");
        return 1;
    }
    kernel_args = args;
    block_dim = {bx, by, bz};
    grid_dim = {gx, gy, gz};
    for (unsigned i = 0; i < n; i++) {
        fibers[i].tid = {i % bx, i / bx % by, i / (bx * by)};
        if (!fibers[i].stack) fibers[i].fresh = true;
    }
    failed = false;
    unsigned long long const blocks = (unsigned long long)gx * gy * gz;
    for (unsigned long long b = 0; b < blocks; b++) {
        unsigned long long const id = reverse ? blocks - 1 - b : b;
        block_idx = {(unsigned)(id % gx), (unsigned)(id / gx % gy), (unsigned)(id / ((unsigned long long)gx * gy))};
        if (!run_block(n)) {
            /* the others are stuck mid-kernel: start them afresh next time */
            for (unsigned i = 0; i < n; i++)
                if (fibers[i].state != DONE) fibers[i].fresh = true;
            snprintf(err, errlen, "%s", error);
            return 1;
        }
    }
    return 0;
}
