// Cycles (at the nominal 2.1 GHz) per AMX tdpbusd and tdpbf16ps, 16 x 16 x 64 bytes, four independent tiles.
// gcc -O2 -o tile_rates tile_rates.c && ./tile_rates
#include <immintrin.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
struct __attribute__((aligned(64))) cfg { unsigned char palette, start; unsigned char r[14]; unsigned short colsb[16]; unsigned char rows[16]; };
__attribute__((target("amx-tile,amx-int8,amx-bf16")))
int main(){ syscall(SYS_arch_prctl, 0x1023, 18);
 struct cfg c; memset(&c,0,sizeof c); c.palette=1; for(int t=0;t<8;t++){c.colsb[t]=64;c.rows[t]=16;}
 _tile_loadconfig(&c);
 static char A[16*64] __attribute__((aligned(64))), B[16*64] __attribute__((aligned(64))); static int C[16*16] __attribute__((aligned(64)));
 _tile_loadd(4,A,64); _tile_loadd(5,B,64); _tile_loadd(6,A,64); _tile_loadd(7,B,64);
 for(int rep=0;rep<2;rep++){
 long n=5000000; _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
 double t=now(); for(long k=0;k<n;k++){ _tile_dpbusd(0,4,5); _tile_dpbusd(1,4,7); _tile_dpbusd(2,6,5); _tile_dpbusd(3,6,7);} t=now()-t;
 _tile_stored(0,C,64);
 printf("tdpbusd: %.2f cycles@2.1GHz each -> %.0f int8 MACs/cycle\n", t*2.1e9/(4.0*n), 16384/(t*2.1e9/(4.0*n)));
 _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
 t=now(); for(long k=0;k<n;k++){ _tile_dpbf16ps(0,4,5); _tile_dpbf16ps(1,4,7); _tile_dpbf16ps(2,6,5); _tile_dpbf16ps(3,6,7);} t=now()-t;
 printf("tdpbf16ps: %.2f cycles@2.1GHz each -> %.0f bf16 MACs/cycle\n", t*2.1e9/(4.0*n), 8192/(t*2.1e9/(4.0*n)));
 }
 _tile_release(); return C[3]==12345;
}
