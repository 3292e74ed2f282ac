/* What g++ needs to compile CUDA C kernels, unmodified, as host code for the emulator in emu.cpp
 * (see README.md here). Compile with -ffp-contract=off: each arithmetic intrinsic below must stay
 * one IEEE operation rounded once, as on the GPU, and g++ (GNU mode) fuses a * b + c by default. */
#pragma once

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <string>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
/* Blocks run one after another on one OS thread, so a static is exactly one block's shared
 * memory; the section lets the launcher overwrite all of it with 0xff before each block
 * (undefined on a GPU: a kernel that reads it before writing sees NaNs and huge counts). */
#define __shared__ static __attribute__((section("emu_shared")))

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

namespace emu {
extern uint3 thread_idx, block_idx;
extern dim3 block_dim, grid_dim;

enum ShuffleKind { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };
void sync_threads();
uint64_t shuffle(ShuffleKind kind, unsigned mask, uint64_t bits, int arg, int width);

template <class T>
T shuffle_as(ShuffleKind kind, unsigned mask, T v, int arg, int width)
{
    static_assert(std::is_arithmetic_v<T> && sizeof(T) <= 8, "shuffles of arithmetic values only");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = shuffle(kind, mask, bits, arg, width);
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* the launch glue: a kernel called with its arguments unpacked from a void* per parameter */
struct Kernel {
    const char* name;
    void (*call)(void** args);
    const char* (*signature)();
    unsigned max_threads; /* __launch_bounds__, or 1024 */
};

template <class... A, size_t... I>
void invoke(void (*f)(A...), void** args, std::index_sequence<I...>)
{
    f(*static_cast<A*>(args[I])...);
}
template <class... A>
constexpr size_t arity(void (*)(A...)) { return sizeof...(A); }
template <auto F>
void trampoline(void** args) { invoke(F, args, std::make_index_sequence<arity(F)>{}); }

/* a parameter's type as the compiler sees it: "P" a pointer, else kind and bytes ("i4", "f8"),
 * "?" for what the Python side cannot pass (structs) */
template <class T>
std::string code()
{
    if constexpr (std::is_pointer_v<T>) return "P";
    else if constexpr (!std::is_arithmetic_v<T>) return "?";
    else {
        char const kind = std::is_floating_point_v<T> ? 'f' : std::is_same_v<T, bool> ? 'b' : std::is_signed_v<T> ? 'i' : 'u';
        return kind + std::to_string(sizeof(T));
    }
}
template <class... A>
const char* signature_of(void (*)(A...))
{
    static std::string const s = [] {
        std::string s;
        ((s += code<A>() + ","), ...);
        return s;
    }();
    return s.c_str();
}
template <auto F>
const char* signature() { return signature_of(F); }
} // namespace emu

#define threadIdx (static_cast<const uint3&>(emu::thread_idx))
#define blockIdx (static_cast<const uint3&>(emu::block_idx))
#define blockDim (static_cast<const dim3&>(emu::block_dim))
#define gridDim (static_cast<const dim3&>(emu::grid_dim))

inline void __syncthreads() { emu::sync_threads(); }
template <class T>
T __shfl_sync(unsigned mask, T v, int lane, int width = 32) { return emu::shuffle_as(emu::SHFL_IDX, mask, v, lane, width); }
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) { return emu::shuffle_as(emu::SHFL_UP, mask, v, (int)d, width); }
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) { return emu::shuffle_as(emu::SHFL_DOWN, mask, v, (int)d, width); }
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lanemask, int width = 32) { return emu::shuffle_as(emu::SHFL_XOR, mask, v, lanemask, width); }

/* fibers share one OS thread and never preempt each other: a plain read-add-write is atomic */
#define EMU_ATOMIC_ADD(T) \
    inline T atomicAdd(T* p, T v) { T const old = *p; *p = old + v; return old; }
EMU_ATOMIC_ADD(int)
EMU_ATOMIC_ADD(unsigned)
EMU_ATOMIC_ADD(unsigned long long)
EMU_ATOMIC_ADD(float)
EMU_ATOMIC_ADD(double)
#undef EMU_ATOMIC_ADD

inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __double2float_rn(double x) { return (float)x; }
/* CUDA saturates where C leaves the conversion undefined */
inline int __double2int_rz(double x)
{
    if (x != x) return 0;
    if (x >= 2147483648.0) return INT_MAX;
    if (x <= -2147483649.0) return INT_MIN;
    return (int)x;
}
