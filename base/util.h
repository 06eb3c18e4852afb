/* Small helpers shared by every layer: time, alignment, checked arithmetic. */
#ifndef PLAIT_UTIL_H
#define PLAIT_UTIL_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

/* Monotonic time in seconds. */
static inline double plait_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Monotonic time in nanoseconds. */
static inline uint64_t plait_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A deadline `seconds` from now; seconds <= 0 means "never" (returns 0). */
static inline double plait_deadline(double seconds)
{
    return seconds > 0 ? plait_now() + seconds : 0.0;
}

/* True when a deadline made by plait_deadline() has passed. */
static inline int plait_deadline_passed(double deadline)
{
    return deadline > 0 && plait_now() > deadline;
}

/* a*b into *out; returns 1 on overflow (and leaves *out unwritten). */
static inline int plait_mul_overflows(size_t a, size_t b, size_t *out)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r))
        return 1;
    *out = r;
    return 0;
}

static inline uint64_t plait_align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

static inline uint64_t plait_min_u64(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* A spin-wait hint to the core (a poll loop's pause). */
static inline void plait_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Reads the abort flag a waiter polls (set from any thread by plait_comm_abort). */
static inline int plait_aborted(const int *abort_flag)
{
    return abort_flag && __atomic_load_n(abort_flag, __ATOMIC_ACQUIRE);
}

#endif
