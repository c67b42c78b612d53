// Cycles (at the nominal 2.1 GHz) per vdpbf16ps, fp32 FMA and vpdpbusd on zmm: 12 independent chains each.
// gcc -O2 -o vector_rates vector_rates.c && ./vector_rates
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx512f,avx512bf16,avx512bw")))
double dp(long n){ __m512 a[12]; for(int i=0;i<12;i++)a[i]=_mm512_set1_ps(i);
 __m512bh x=(__m512bh)_mm512_set1_epi32(0x3f803f80), y=(__m512bh)_mm512_set1_epi32(0x3f003f00);
 double t=now(); for(long k=0;k<n;k++){ for(int i=0;i<12;i++) a[i]=_mm512_dpbf16_ps(a[i],x,y); __asm__ volatile(""::"v"(a[0]),"v"(a[5]),"v"(a[11]));}
 t=now()-t; float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(a[i]); if(s==1.234f)printf("x");
 return t; }
__attribute__((target("avx512f,avx512bf16,avx512bw")))
double fma32(long n){ __m512 a[12]; for(int i=0;i<12;i++)a[i]=_mm512_set1_ps(i);
 __m512 x=_mm512_set1_ps(1.0001f), y=_mm512_set1_ps(0.5f);
 double t=now(); for(long k=0;k<n;k++){ for(int i=0;i<12;i++) a[i]=_mm512_fmadd_ps(a[i],x,y); __asm__ volatile(""::"v"(a[0]),"v"(a[5]),"v"(a[11]));}
 t=now()-t; float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(a[i]); if(s==1.234f)printf("x");
 return t; }
__attribute__((target("avx512f,avx512vnni,avx512bw")))
double vnni(long n){ __m512i a[12]; for(int i=0;i<12;i++)a[i]=_mm512_set1_epi32(i);
 __m512i x=_mm512_set1_epi32(0x01010101), y=_mm512_set1_epi32(0x02020202);
 double t=now(); for(long k=0;k<n;k++){ for(int i=0;i<12;i++) a[i]=_mm512_dpbusd_epi32(a[i],x,y); __asm__ volatile(""::"v"(a[0]),"v"(a[5]),"v"(a[11]));}
 t=now()-t; int s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_epi32(a[i]); if(s==1234)printf("x");
 return t; }
int main(){ long n=20000000; double ghz=2.1e9;
 for(int r=0;r<2;r++){ double t1=dp(n),t2=fma32(n),t3=vnni(n);
 printf("cycles per instr @2.1GHz: dpbf16 %.2f  fma %.2f  vpdpbusd %.2f\n", t1*ghz/(n*12.0), t2*ghz/(n*12.0), t3*ghz/(n*12.0)); }
}
