/* perf/ntstore.c: do non-temporal stores pay on this machine? (docs/performance.md)
 *
 * Copies 64 MiB from src to dst in 128 KiB pieces (a FIFO slot's worth) with
 * memcpy and with non-temporal stores, and runs a float sum dst = a + b (b one
 * cache-resident piece, as a received slot is) with ordinary and with
 * non-temporal stores: the last step of an allreduce whose output is not read
 * again. The variants alternate, 10 rounds, best of each; prints GB/s of the
 * bytes moved. It does not use plait. x86-64 with AVX2 only. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx2"))) static void copy_nt(char *d, const char *s, size_t n){
  for(size_t i=0;i<n;i+=32) _mm256_stream_si256((__m256i*)(d+i), _mm256_loadu_si256((const __m256i*)(s+i)));
}
__attribute__((target("avx2"))) static void sum_st(float *d, const float *a, const float *b, size_t n){
  for(size_t i=0;i<n;i+=8) _mm256_storeu_ps(d+i, _mm256_add_ps(_mm256_loadu_ps(a+i), _mm256_loadu_ps(b+i)));
}
__attribute__((target("avx2"))) static void sum_nt(float *d, const float *a, const float *b, size_t n){
  for(size_t i=0;i<n;i+=8) _mm256_stream_ps(d+i, _mm256_add_ps(_mm256_loadu_ps(a+i), _mm256_loadu_ps(b+i)));
}
int main(void){
  size_t N=64<<20, P=128<<10;
  char *s=aligned_alloc(64,N),*d=aligned_alloc(64,N),*b=aligned_alloc(64,P);
  memset(s,1,N);memset(d,2,N);memset(b,0,P);
  double best[4]={1e9,1e9,1e9,1e9};
  for(int r=0;r<10;r++) for(int v=0;v<4;v++){
    double t=now();
    for(size_t o=0;o<N;o+=P){
      if(v==0) memcpy(d+o,s+o,P); else if(v==1) copy_nt(d+o,s+o,P);
      else if(v==2) sum_st((float*)(d+o),(const float*)(s+o),(const float*)b,P/4);
      else sum_nt((float*)(d+o),(const float*)(s+o),(const float*)b,P/4);
    }
    _mm_sfence(); t=now()-t; if(t<best[v])best[v]=t;
  }
  printf("copy 64 MiB in 128 KiB pieces: memcpy %.1f GB/s, NT %.1f GB/s (read+write bytes)\n", 2.0*N/best[0]/1e9, 2.0*N/best[1]/1e9);
  printf("sum dst=a+b (b cache-resident): stores %.1f GB/s, NT %.1f GB/s (a+dst bytes)\n", 2.0*N/best[2]/1e9, 2.0*N/best[3]/1e9);
  return 0;
}
