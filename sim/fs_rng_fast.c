/* fs_rng_fast.c — the fast path of fs_rng_normal_fill: four Box-Muller pairs per AVX2 step,
 * bit-identical to the scalar path in fs_rng.c.
 *
 * Why this is a transcription and not "a fast log and sincos": every synthetic weight, the golden
 * dump and every test are pinned to the doubles that glibc's scalar log(), sin() and cos() return
 * (fs_rng_normal). A vector approximation that is "as accurate" still differs in the last bit of
 * a few values in a million, and glibc's own vector libm (libmvec) is not bit-identical to its
 * scalar functions either. So the kernels below perform, lane by lane, exactly the IEEE
 * operations of the code glibc runs on a CPU with AVX2 and FMA: glibc 2.28+ selects
 * __ieee754_log_fma and __sincos_fma/__sin_fma/__cos_fma there (ifunc "FMA && AVX2 usable"),
 * which are the generic C sources (ARM optimized-routines' log; IBM's do_sin/do_cos/
 * reduce_sincos) compiled with -mfma -mavx2. The compiler contracted some a*b+c into FMAs in
 * that build; each fma() below stands where the compiled library has one (read from the
 * disassembly of Debian's glibc 2.36), each plain mul/add where it has none. This file is
 * therefore compiled with -ffp-contract=off (Makefile): a contraction added here would change
 * results.
 *
 * Safety net, because that correspondence is a fact about the host's libm and not something the
 * compiler can check:
 *   - the fast path is only used when the CPU has AVX2 and FMA (otherwise glibc runs its
 *     non-FMA variants, which this file does not mirror);
 *   - __sincostab (IBM's table of sin/cos at k/128 as double-double) is not copied into this
 *     source: it is read from the libm mapped into this process, located by its first entries;
 *   - at first use a self-test compares the kernels with scalar libm on inputs that reach every
 *     branch (both log paths, every range and quadrant of sincos, the Taylor and table paths of
 *     do_sin, the table index extremes) plus random ones. Any mismatch, a missing table or a
 *     CPU without AVX2/FMA leaves the scalar path in charge: slower, never different.
 * tests/test_rng.c compares the fast path with the scalar one over tens of millions of values.
 *
 * The log table and polynomial coefficients are from ARM's optimized-routines (math/log_data.c,
 * Copyright (c) 2018 Arm Limited, SPDX-License-Identifier: MIT OR Apache-2.0 WITH
 * LLVM-exception), which is what glibc's e_log_data.c holds. */
#include "fs_rng.h"

#include <dlfcn.h>
#include <link.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define FS_RNG_HAVE_AVX2 1
#include <immintrin.h>
#else
#define FS_RNG_HAVE_AVX2 0
#endif

static inline double dbits(uint64_t u)
{
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* ---- log (ARM optimized-routines, LOG_TABLE_BITS 7, LOG_POLY_ORDER 6, LOG_POLY1_ORDER 12) ---- */
#define LOG_LN2HI 0x1.62e42fefa3800p-1
#define LOG_LN2LO 0x1.ef35793c76730p-45
static const double log_A[5] = {-0x1.0000000000001p-1, 0x1.555555551305bp-2, -0x1.fffffffeb459p-3,
                                0x1.999b324f10111p-3, -0x1.55575e506c89fp-3};
static const double log_B[11] = {-0x1p-1,
                                 0x1.5555555555577p-2,
                                 -0x1.ffffffffffdcbp-3,
                                 0x1.999999995dd0cp-3,
                                 -0x1.55555556745a7p-3,
                                 0x1.24924a344de3p-3,
                                 -0x1.fffffa4423d65p-4,
                                 0x1.c7184282ad6cap-4,
                                 -0x1.999eb43b068ffp-4,
                                 0x1.78182f7afd085p-4,
                                 -0x1.5521375d145cdp-4};
/* {invc, logc} for the 128 subintervals of [0x1.6p-1, 0x1.6p0). */
static const double log_tab[128][2] __attribute__((aligned(64))) = {
    {0x1.734f0c3e0de9fp+0, -0x1.7cc7f79e69000p-2}, {0x1.713786a2ce91fp+0, -0x1.76feec20d0000p-2},
    {0x1.6f26008fab5a0p+0, -0x1.713e31351e000p-2}, {0x1.6d1a61f138c7dp+0, -0x1.6b85b38287800p-2},
    {0x1.6b1490bc5b4d1p+0, -0x1.65d5590807800p-2}, {0x1.69147332f0cbap+0, -0x1.602d076180000p-2},
    {0x1.6719f18224223p+0, -0x1.5a8ca86909000p-2}, {0x1.6524f99a51ed9p+0, -0x1.54f4356035000p-2},
    {0x1.63356aa8f24c4p+0, -0x1.4f637c36b4000p-2}, {0x1.614b36b9ddc14p+0, -0x1.49da7fda85000p-2},
    {0x1.5f66452c65c4cp+0, -0x1.445923989a800p-2}, {0x1.5d867b5912c4fp+0, -0x1.3edf439b0b800p-2},
    {0x1.5babccb5b90dep+0, -0x1.396ce448f7000p-2}, {0x1.59d61f2d91a78p+0, -0x1.3401e17bda000p-2},
    {0x1.5805612465687p+0, -0x1.2e9e2ef468000p-2}, {0x1.56397cee76bd3p+0, -0x1.2941b3830e000p-2},
    {0x1.54725e2a77f93p+0, -0x1.23ec58cda8800p-2}, {0x1.52aff42064583p+0, -0x1.1e9e129279000p-2},
    {0x1.50f22dbb2bddfp+0, -0x1.1956d2b48f800p-2}, {0x1.4f38f4734ded7p+0, -0x1.141679ab9f800p-2},
    {0x1.4d843cfde2840p+0, -0x1.0edd094ef9800p-2}, {0x1.4bd3ec078a3c8p+0, -0x1.09aa518db1000p-2},
    {0x1.4a27fc3e0258ap+0, -0x1.047e65263b800p-2}, {0x1.4880524d48434p+0, -0x1.feb224586f000p-3},
    {0x1.46dce1b192d0bp+0, -0x1.f474a7517b000p-3}, {0x1.453d9d3391854p+0, -0x1.ea4443d103000p-3},
    {0x1.43a2744b4845ap+0, -0x1.e020d44e9b000p-3}, {0x1.420b54115f8fbp+0, -0x1.d60a22977f000p-3},
    {0x1.40782da3ef4b1p+0, -0x1.cc00104959000p-3}, {0x1.3ee8f5d57fe8fp+0, -0x1.c202956891000p-3},
    {0x1.3d5d9a00b4ce9p+0, -0x1.b81178d811000p-3}, {0x1.3bd60c010c12bp+0, -0x1.ae2c9ccd3d000p-3},
    {0x1.3a5242b75dab8p+0, -0x1.a45402e129000p-3}, {0x1.38d22cd9fd002p+0, -0x1.9a877681df000p-3},
    {0x1.3755bc5847a1cp+0, -0x1.90c6d69483000p-3}, {0x1.35dce49ad36e2p+0, -0x1.87120a645c000p-3},
    {0x1.34679984dd440p+0, -0x1.7d68fb4143000p-3}, {0x1.32f5cceffcb24p+0, -0x1.73cb83c627000p-3},
    {0x1.3187775a10d49p+0, -0x1.6a39a9b376000p-3}, {0x1.301c8373e3990p+0, -0x1.60b3154b7a000p-3},
    {0x1.2eb4ebb95f841p+0, -0x1.5737d76243000p-3}, {0x1.2d50a0219a9d1p+0, -0x1.4dc7b8fc23000p-3},
    {0x1.2bef9a8b7fd2ap+0, -0x1.4462c51d20000p-3}, {0x1.2a91c7a0c1babp+0, -0x1.3b08abc830000p-3},
    {0x1.293726014b530p+0, -0x1.31b996b490000p-3}, {0x1.27dfa5757a1f5p+0, -0x1.2875490a44000p-3},
    {0x1.268b39b1d3bbfp+0, -0x1.1f3b9f879a000p-3}, {0x1.2539d838ff5bdp+0, -0x1.160c8252ca000p-3},
    {0x1.23eb7aac9083bp+0, -0x1.0ce7f57f72000p-3}, {0x1.22a012ba940b6p+0, -0x1.03cdc49fea000p-3},
    {0x1.2157996cc4132p+0, -0x1.f57bdbc4b8000p-4}, {0x1.201201dd2fc9bp+0, -0x1.e370896404000p-4},
    {0x1.1ecf4494d480bp+0, -0x1.d17983ef94000p-4}, {0x1.1d8f5528f6569p+0, -0x1.bf9674ed8a000p-4},
    {0x1.1c52311577e7cp+0, -0x1.adc79202f6000p-4}, {0x1.1b17c74cb26e9p+0, -0x1.9c0c3e7288000p-4},
    {0x1.19e010c2c1ab6p+0, -0x1.8a646b372c000p-4}, {0x1.18ab07bb670bdp+0, -0x1.78d01b3ac0000p-4},
    {0x1.1778a25efbcb6p+0, -0x1.674f145380000p-4}, {0x1.1648d354c31dap+0, -0x1.55e0e6d878000p-4},
    {0x1.151b990275fddp+0, -0x1.4485cdea1e000p-4}, {0x1.13f0ea432d24cp+0, -0x1.333d94d6aa000p-4},
    {0x1.12c8b7210f9dap+0, -0x1.22079f8c56000p-4}, {0x1.11a3028ecb531p+0, -0x1.10e4698622000p-4},
    {0x1.107fbda8434afp+0, -0x1.ffa6c6ad20000p-5}, {0x1.0f5ee0f4e6bb3p+0, -0x1.dda8d4a774000p-5},
    {0x1.0e4065d2a9fcep+0, -0x1.bbcece4850000p-5}, {0x1.0d244632ca521p+0, -0x1.9a1894012c000p-5},
    {0x1.0c0a77ce2981ap+0, -0x1.788583302c000p-5}, {0x1.0af2f83c636d1p+0, -0x1.5715e67d68000p-5},
    {0x1.09ddb98a01339p+0, -0x1.35c8a49658000p-5}, {0x1.08cabaf52e7dfp+0, -0x1.149e364154000p-5},
    {0x1.07b9f2f4e28fbp+0, -0x1.e72c082eb8000p-6}, {0x1.06ab58c358f19p+0, -0x1.a55f152528000p-6},
    {0x1.059eea5ecf92cp+0, -0x1.63d62cf818000p-6}, {0x1.04949cdd12c90p+0, -0x1.228fb8caa0000p-6},
    {0x1.038c6c6f0ada9p+0, -0x1.c317b20f90000p-7}, {0x1.02865137932a9p+0, -0x1.419355daa0000p-7},
    {0x1.0182427ea7348p+0, -0x1.81203c2ec0000p-8}, {0x1.008040614b195p+0, -0x1.0040979240000p-9},
    {0x1.fe01ff726fa1ap-1, 0x1.feff384900000p-9},  {0x1.fa11cc261ea74p-1, 0x1.7dc41353d0000p-7},
    {0x1.f6310b081992ep-1, 0x1.3cea3c4c28000p-6},  {0x1.f25f63ceeadcdp-1, 0x1.b9fc114890000p-6},
    {0x1.ee9c8039113e7p-1, 0x1.1b0d8ce110000p-5},  {0x1.eae8078cbb1abp-1, 0x1.58a5bd001c000p-5},
    {0x1.e741aa29d0c9bp-1, 0x1.95c8340d88000p-5},  {0x1.e3a91830a99b5p-1, 0x1.d276aef578000p-5},
    {0x1.e01e009609a56p-1, 0x1.07598e598c000p-4},  {0x1.dca01e577bb98p-1, 0x1.253f5e30d2000p-4},
    {0x1.d92f20b7c9103p-1, 0x1.42edd8b380000p-4},  {0x1.d5cac66fb5ccep-1, 0x1.606598757c000p-4},
    {0x1.d272caa5ede9dp-1, 0x1.7da76356a0000p-4},  {0x1.cf26e3e6b2ccdp-1, 0x1.9ab434e1c6000p-4},
    {0x1.cbe6da2a77902p-1, 0x1.b78c7bb0d6000p-4},  {0x1.c8b266d37086dp-1, 0x1.d431332e72000p-4},
    {0x1.c5894bd5d5804p-1, 0x1.f0a3171de6000p-4},  {0x1.c26b533bb9f8cp-1, 0x1.067152b914000p-3},
    {0x1.bf583eeece73fp-1, 0x1.147858292b000p-3},  {0x1.bc4fd75db96c1p-1, 0x1.2266ecdca3000p-3},
    {0x1.b951e0c864a28p-1, 0x1.303d7a6c55000p-3},  {0x1.b65e2c5ef3e2cp-1, 0x1.3dfc33c331000p-3},
    {0x1.b374867c9888bp-1, 0x1.4ba366b7a8000p-3},  {0x1.b094b211d304ap-1, 0x1.5933928d1f000p-3},
    {0x1.adbe885f2ef7ep-1, 0x1.66acd2418f000p-3},  {0x1.aaf1d31603da2p-1, 0x1.740f8ec669000p-3},
    {0x1.a82e63fd358a7p-1, 0x1.815c0f51af000p-3},  {0x1.a5740ef09738bp-1, 0x1.8e92954f68000p-3},
    {0x1.a2c2a90ab4b27p-1, 0x1.9bb3602f84000p-3},  {0x1.a01a01393f2d1p-1, 0x1.a8bed1c2c0000p-3},
    {0x1.9d79f24db3c1bp-1, 0x1.b5b515c01d000p-3},  {0x1.9ae2505c7b190p-1, 0x1.c2967ccbcc000p-3},
    {0x1.9852ef297ce2fp-1, 0x1.cf635d5486000p-3},  {0x1.95cbaeea44b75p-1, 0x1.dc1bd3446c000p-3},
    {0x1.934c69de74838p-1, 0x1.e8c01b8cfe000p-3},  {0x1.90d4f2f6752e6p-1, 0x1.f5509c0179000p-3},
    {0x1.8e6528effd79dp-1, 0x1.00e6c121fb800p-2},  {0x1.8bfce9fcc007cp-1, 0x1.071b80e93d000p-2},
    {0x1.899c0dabec30ep-1, 0x1.0d46b9e867000p-2},  {0x1.87427aa2317fbp-1, 0x1.13687334bd000p-2},
    {0x1.84f00acb39a08p-1, 0x1.1980d67234800p-2},  {0x1.82a49e8653e55p-1, 0x1.1f8ffe0cc8000p-2},
    {0x1.8060195f40260p-1, 0x1.2595fd7636800p-2},  {0x1.7e22563e0a329p-1, 0x1.2b9300914a800p-2},
    {0x1.7beb377dcb5adp-1, 0x1.3187210436000p-2},  {0x1.79baa679725c2p-1, 0x1.377266dec1800p-2},
    {0x1.77907f2170657p-1, 0x1.3d54ffbaf3000p-2},  {0x1.756cadbd6130cp-1, 0x1.432eee32fe000p-2},
};

/* ---- sin/cos (glibc sysdeps/ieee754/dbl-64/s_sin.c, usncs.h; values as in the compiled code) ---- */
#define SC_BIG 0x1.8p45                /* big */
#define SC_HP0 0x1.921FB54442D18p0     /* pi/2 high */
#define SC_HP1 0x1.1A62633145C07p-54   /* pi/2 low */
#define SC_MP1 0x1.921FB58p0
#define SC_MP2 -0x1.DDE973Cp-27
#define SC_PP3 -0x1.CB3B398p-55
#define SC_PP4 -0x1.d747f23e32ed7p-83
#define SC_HPINV 0x1.45F306DC9C883p-1
#define SC_TOINT 0x1.8p52
#define SC_S1 -0x1.5555555555555p-3
#define SC_S2 0x1.1111111110ECEp-7
#define SC_S3 -0x1.A01A019DB08B8p-13
#define SC_S4 0x1.71DE27B9A7ED9p-19
#define SC_S5 -0x1.ADDFFC2FCDF59p-26
#define SC_SN3_BITS 0xbfc5555555555515ULL  /* -1.66666666666664880952546298448555E-01 */
#define SC_SN5_BITS 0x3f811110e829872fULL  /*  8.33333214285722277379541354343671E-03 */
#define SC_CS2 0.5                          /*  4.99999999999999999999950396842453E-01 */
#define SC_CS4_BITS 0xbfa5555555555535ULL  /* -4.16666666666664434524222570944589E-02 */
#define SC_CS6_BITS 0x3f56c16bedd9e239ULL  /*  1.38888874007937613028114285595617E-03 */
#define SC_TAYLOR_MAX 0.126
#define SC_NTAB 440                         /* __sincostab: {sn, ssn, cs, ccs} at k/128, k < 110 */

static double sctab[SC_NTAB] __attribute__((aligned(64)));
/* log_tab is 16-byte aligned (rows are loaded as pairs) */

/* ---- finding __sincostab in the libm of this process ---- */

typedef struct scan_ctx {
    const void *libm_base;
    const double *found;
} scan_ctx;

/* Entry 0 is {0, 0, 1, 0}; entry 1 starts with sin(1/128) = 0x3F7FFFEAAAAEEEEF. The hi parts of
 * the other entries are then checked against libm's own sin/cos (they are the correctly rounded
 * values), the lo parts against their size. */
static int plausible_sincostab(const double *t)
{
    for (int k = 0; k < SC_NTAB / 4; k++) {
        double x = k / 128.0, sn = t[4 * k], ssn = t[4 * k + 1], cs = t[4 * k + 2], ccs = t[4 * k + 3];
        if (sn != sin(x) || cs != cos(x)) return 0;
        if (!(fabs(ssn) <= 0x1p-53 * fabs(sn) || (sn == 0 && ssn == 0))) return 0;
        if (!(fabs(ccs) <= 0x1p-53 * fabs(cs))) return 0;
    }
    return 1;
}

static int scan_phdr(struct dl_phdr_info *info, size_t size, void *data)
{
    scan_ctx *c = data;
    if ((const void *)info->dlpi_addr != c->libm_base || c->found) return 0;
    static const uint64_t sig[5] = {0, 0, 0x3ff0000000000000ULL, 0, 0x3F7FFFEAAAAEEEEFULL};
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_R)) continue;
        const unsigned char *p = (const unsigned char *)(info->dlpi_addr + ph->p_vaddr);
        size_t n = ph->p_memsz;
        for (size_t off = 0; off + SC_NTAB * 8 <= n; off += 8) {
            if (memcmp(p + off, sig, sizeof sig)) continue;
            if (plausible_sincostab((const double *)(p + off))) {
                c->found = (const double *)(p + off);
                return 1;
            }
        }
    }
    return 0;
}

static int load_sincostab(void)
{
    Dl_info di;
    double (*fn)(double) = sin;
    if (!dladdr(*(void **)&fn, &di) || !di.dli_fbase) return 0;
    scan_ctx c = {.libm_base = di.dli_fbase, .found = NULL};
    dl_iterate_phdr(scan_phdr, &c);
    if (!c.found) return 0;
    memcpy(sctab, c.found, sizeof sctab);
    return 1;
}

#if FS_RNG_HAVE_AVX2

/* ---- AVX2 + FMA: 4 lanes; masks are all-ones lanes of a vector ---- */
#define FN(name) name##_avx2
#define NL 4
#define TGT __attribute__((target("avx2,fma"), always_inline)) static inline
#define TGTF __attribute__((target("avx2,fma"))) static
typedef __m256d vd;
typedef __m256i vi;
typedef __m256d vm;
#define VSET(x) _mm256_set1_pd(x)
#define VSETB(b) _mm256_castsi256_pd(_mm256_set1_epi64x((long long)(b)))
#define VZERO _mm256_setzero_pd()
#define VADD _mm256_add_pd
#define VSUB _mm256_sub_pd
#define VMUL _mm256_mul_pd
#define VSQRT _mm256_sqrt_pd
#define VFMA _mm256_fmadd_pd   /* a*b + c, one rounding */
#define VFNMA _mm256_fnmadd_pd /* -(a*b) + c */
#define VFMSUB _mm256_fmsub_pd /* a*b - c */
#define VABS(x) _mm256_andnot_pd(VSET(-0.0), x)
#define VNEG(x) _mm256_xor_pd(x, VSET(-0.0))
#define VCOPYSIGN(m, s) _mm256_or_pd(_mm256_andnot_pd(VSET(-0.0), m), _mm256_and_pd(s, VSET(-0.0)))
#define VNEG_IF(m, x) VSEL(m, VNEG(x), x)
#define VCMP(a, b, op) _mm256_cmp_pd(a, b, op)
#define VSEL(m, yes, no) _mm256_blendv_pd(no, yes, m)
#define VANY(m) (!_mm256_testz_pd(m, m))
#define MOR(a, b) _mm256_or_pd(a, b)
#define MANDN(a, b) _mm256_andnot_pd(a, b) /* ~a & b */
#define VLOADU _mm256_loadu_pd
#define VSTOREU _mm256_storeu_pd
#define ISET(x) _mm256_set1_epi64x((long long)(x))
#define IOTA _mm256_setr_epi64x(0, 1, 2, 3)
#define IADD _mm256_add_epi64
#define ISUB _mm256_sub_epi64
#define IXOR _mm256_xor_si256
#define IAND _mm256_and_si256
#define ISRL _mm256_srli_epi64
#define ISLL _mm256_slli_epi64
#define ICMPGT(a, b) _mm256_castsi256_pd(_mm256_cmpgt_epi64(a, b))
#define ICMPEQ(a, b) _mm256_castsi256_pd(_mm256_cmpeq_epi64(a, b))
#define ASD _mm256_castsi256_pd
#define ASI _mm256_castpd_si256
#define GATHER(base, idx) _mm256_i64gather_pd(base, idx, 8)
#define IMUL mullo64_avx2
#define U53_TO_PD u53_to_pd_avx2
#define SRA52_TO_PD sra52_to_pd_avx2
#define TABLE4(u, a, b, c, d) table4_avx2(u, &(a), &(b), &(c), &(d))
#define TABLE2(i2, a, b) ((a) = GATHER(&log_tab[0][0], i2), (b) = GATHER(&log_tab[0][1], i2))
#define STORE_PAIRS store_pairs_avx2

/* 64-bit multiply, low half (AVX2 has only 32x32->64). */
TGT vi mullo64_avx2(vi a, uint64_t b)
{
    const vi blo = ISET(b & 0xffffffffu), bhi = ISET(b >> 32);
    const vi cross = IADD(_mm256_mul_epu32(ISRL(a, 32), blo), _mm256_mul_epu32(a, bhi));
    return IADD(_mm256_mul_epu32(a, blo), ISLL(cross, 32));
}
/* m < 2^53 to double, exactly: the two 32-bit halves through the 2^52 / 2^84 magic numbers,
 * summed without rounding (the sum has at most 53 significant bits). */
TGT vd u53_to_pd_avx2(vi m)
{
    const vd lo = VSUB(ASD(IXOR(IAND(m, ISET(0xffffffffu)), ISET(0x4330000000000000ULL))), VSET(0x1p52));
    const vd hi = VSUB(ASD(IXOR(ISRL(m, 32), ISET(0x4530000000000000ULL))), VSET(0x1p84));
    return VADD(hi, lo);
}
/* (double)((int64_t)t >> 52) without a 64-bit arithmetic shift: the top 12 bits with the sign
 * bit flipped, through the 2^52 magic, minus the flip. Exact. */
TGT vd sra52_to_pd_avx2(vi t)
{
    const vi top = IXOR(ISRL(t, 52), ISET(0x800));
    return VSUB(ASD(IXOR(top, ISET(0x4330000000000000ULL))), VSET(0x1p52 + 2048.0));
}
/* The four __sincostab values {sn, ssn, cs, ccs} of entry u.i[LOW_HALF] for each lane: one
 * aligned 32-byte load per lane and a 4x4 transpose (cheaper than four gathers). */
TGT void table4_avx2(vd u, vd *sn, vd *ssn, vd *cs, vd *ccs)
{
    long long idx[4] __attribute__((aligned(32)));
    _mm256_store_si256((vi *)idx, IAND(ASI(u), ISET(0xffffffffu)));
    const vd e0 = _mm256_load_pd(&sctab[4 * idx[0]]), e1 = _mm256_load_pd(&sctab[4 * idx[1]]);
    const vd e2 = _mm256_load_pd(&sctab[4 * idx[2]]), e3 = _mm256_load_pd(&sctab[4 * idx[3]]);
    const vd t0 = _mm256_unpacklo_pd(e0, e1), t1 = _mm256_unpackhi_pd(e0, e1);
    const vd t2 = _mm256_unpacklo_pd(e2, e3), t3 = _mm256_unpackhi_pd(e2, e3);
    *sn = _mm256_permute2f128_pd(t0, t2, 0x20);
    *cs = _mm256_permute2f128_pd(t0, t2, 0x31);
    *ssn = _mm256_permute2f128_pd(t1, t3, 0x20);
    *ccs = _mm256_permute2f128_pd(t1, t3, 0x31);
}
/* out = z0[0] z1[0] z0[1] z1[1] ... */
TGT void store_pairs_avx2(double *out, vd z0, vd z1)
{
    const vd lo = _mm256_unpacklo_pd(z0, z1), hi = _mm256_unpackhi_pd(z0, z1);
    _mm256_storeu_pd(out, _mm256_permute2f128_pd(lo, hi, 0x20));
    _mm256_storeu_pd(out + 4, _mm256_permute2f128_pd(lo, hi, 0x31));
}

#include "fs_rng_fast.inc"

#undef FN
#undef NL
#undef TGT
#undef TGTF
#undef VSET
#undef VSETB
#undef VZERO
#undef VADD
#undef VSUB
#undef VMUL
#undef VSQRT
#undef VFMA
#undef VFNMA
#undef VFMSUB
#undef VABS
#undef VNEG
#undef VCOPYSIGN
#undef VNEG_IF
#undef VCMP
#undef VSEL
#undef VANY
#undef MOR
#undef MANDN
#undef VLOADU
#undef VSTOREU
#undef ISET
#undef IOTA
#undef IADD
#undef ISUB
#undef IXOR
#undef IAND
#undef ISRL
#undef ISLL
#undef ICMPGT
#undef ICMPEQ
#undef ASD
#undef ASI
#undef GATHER
#undef IMUL
#undef U53_TO_PD
#undef SRA52_TO_PD
#undef TABLE4
#undef TABLE2
#undef STORE_PAIRS

/* ---- AVX-512 (F, DQ, VL): 8 lanes; native 64-bit multiply and conversions, mask registers.
 * Same arithmetic, so the same bits; used where the CPU has it. ---- */
#define FN(name) name##_avx512
#define NL 8
#define ISA512 "avx512f,avx512dq,avx512vl,avx2,fma"
#define TGT __attribute__((target(ISA512), always_inline)) static inline
#define TGTF __attribute__((target(ISA512))) static
#define vd __m512d
#define vi __m512i
#define vm __mmask8
#define VSET(x) _mm512_set1_pd(x)
#define VSETB(b) _mm512_castsi512_pd(_mm512_set1_epi64((long long)(b)))
#define VZERO _mm512_setzero_pd()
#define VADD _mm512_add_pd
#define VSUB _mm512_sub_pd
#define VMUL _mm512_mul_pd
#define VSQRT _mm512_sqrt_pd
#define VFMA _mm512_fmadd_pd
#define VFNMA _mm512_fnmadd_pd
#define VFMSUB _mm512_fmsub_pd
#define VABS(x) _mm512_andnot_pd(VSET(-0.0), x)
#define VNEG(x) _mm512_xor_pd(x, VSET(-0.0))
/* bitwise select (sign bit ? s : m) in one vpternlogq (0xCA = A ? B : C) */
#define VCOPYSIGN(m, s)                                                                                        \
    _mm512_castsi512_pd(_mm512_ternarylogic_epi64(_mm512_castpd_si512(VSET(-0.0)), _mm512_castpd_si512(s),       \
                                                  _mm512_castpd_si512(m), 0xCA))
#define VNEG_IF(m, x) _mm512_mask_xor_pd(x, m, x, VSET(-0.0)) /* one masked xor */
#define VCMP(a, b, op) _mm512_cmp_pd_mask(a, b, op)
#define VSEL(m, yes, no) _mm512_mask_blend_pd(m, no, yes)
#define VANY(m) ((m) != 0)
#define MOR(a, b) ((vm)((a) | (b)))
#define MANDN(a, b) ((vm)(~(a) & (b)))
#define VLOADU _mm512_loadu_pd
#define VSTOREU _mm512_storeu_pd
#define ISET(x) _mm512_set1_epi64((long long)(x))
#define IOTA _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7)
#define IADD _mm512_add_epi64
#define ISUB _mm512_sub_epi64
#define IXOR _mm512_xor_si512
#define IAND _mm512_and_si512
#define ISRL _mm512_srli_epi64
#define ISLL _mm512_slli_epi64
#define ICMPGT(a, b) _mm512_cmpgt_epi64_mask(a, b)
#define ICMPEQ(a, b) _mm512_cmpeq_epi64_mask(a, b)
#define ASD _mm512_castsi512_pd
#define ASI _mm512_castpd_si512
#define GATHER(base, idx) _mm512_i64gather_pd(idx, base, 8)
#define IMUL(a, b) _mm512_mullo_epi64(a, ISET(b))
#define U53_TO_PD _mm512_cvtepu64_pd                                  /* exact below 2^53 */
#define SRA52_TO_PD(t) _mm512_cvtepi64_pd(_mm512_srai_epi64(t, 52)) /* exact */
#define TABLE4(u, a, b, c, d) table4_avx512(u, &(a), &(b), &(c), &(d))
#define TABLE2(i2, a, b) table2_avx512(i2, &(a), &(b))
#define STORE_PAIRS store_pairs_avx512

/* Table lookups without gathers (Zen 4's vgatherqpd cost a third of the kernel's time): the
 * lane indices go through one store to eight scalar loads, each lane's 32-byte entry is one
 * load, and an 8x4 transpose (inserts, unpacks, two-source permutes) makes the four vectors. */
TGT void table4_avx512(vd u, vd *sn, vd *ssn, vd *cs, vd *ccs)
{
    long long ix[8] __attribute__((aligned(64)));
    _mm512_store_si512((void *)ix, ISLL(IAND(ASI(u), ISET(0xffffffffu)), 2));
#define E(j) _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_load_pd(&sctab[ix[j]])), _mm256_load_pd(&sctab[ix[(j) + 4]]), 1)
    const vd e0 = E(0), e1 = E(1), e2 = E(2), e3 = E(3); /* lane j low half, lane j+4 high half */
#undef E
    const vd t0 = _mm512_unpacklo_pd(e0, e1), t1 = _mm512_unpackhi_pd(e0, e1);
    const vd t2 = _mm512_unpacklo_pd(e2, e3), t3 = _mm512_unpackhi_pd(e2, e3);
    const vi lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    *sn = _mm512_permutex2var_pd(t0, lo, t2);
    *cs = _mm512_permutex2var_pd(t0, hi, t2);
    *ssn = _mm512_permutex2var_pd(t1, lo, t3);
    *ccs = _mm512_permutex2var_pd(t1, hi, t3);
}
/* {invc, logc} of log_tab row i2/2 for each lane, the same way. */
TGT void table2_avx512(vi i2, vd *invc, vd *logc)
{
    long long ix[8] __attribute__((aligned(64)));
    _mm512_store_si512((void *)ix, i2);
    const double *t = &log_tab[0][0];
    vd a = _mm512_castpd128_pd512(_mm_load_pd(t + ix[0])), b = _mm512_castpd128_pd512(_mm_load_pd(t + ix[4]));
    a = _mm512_insertf64x2(a, _mm_load_pd(t + ix[1]), 1);
    b = _mm512_insertf64x2(b, _mm_load_pd(t + ix[5]), 1);
    a = _mm512_insertf64x2(a, _mm_load_pd(t + ix[2]), 2);
    b = _mm512_insertf64x2(b, _mm_load_pd(t + ix[6]), 2);
    a = _mm512_insertf64x2(a, _mm_load_pd(t + ix[3]), 3);
    b = _mm512_insertf64x2(b, _mm_load_pd(t + ix[7]), 3);
    *invc = _mm512_permutex2var_pd(a, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), b);
    *logc = _mm512_permutex2var_pd(a, _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15), b);
}
TGT void store_pairs_avx512(double *out, vd z0, vd z1)
{
    const vi lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    _mm512_storeu_pd(out, _mm512_permutex2var_pd(z0, lo, z1));
    _mm512_storeu_pd(out + 8, _mm512_permutex2var_pd(z0, hi, z1));
}

#include "fs_rng_fast.inc"

#undef vd
#undef vi
#undef vm

static int cpu_has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
static int cpu_has_avx512(void)
{
    __builtin_cpu_init();
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
}
#endif /* FS_RNG_HAVE_AVX2 */

/* ---- self-test and dispatch ---- */

static int same(double a, double b) { return !memcmp(&a, &b, sizeof a); }

/* A uniform whose angle 2 pi u lands at th (for probing the sincos ranges). */
static double u_for_angle(double th) { return th / 6.283185307179586476925; }

/* Inputs that reach every branch: all 128 log intervals at many exponents, the near-1 band and
 * its edges (1.0 itself included: a uniform can round to it), every sincos range and its
 * boundaries, the Taylor edge 0.126, quadrant edges, and every __sincostab index +- half a step
 * in ranges A, B and C. */
static int probes(double *u1, double *u2, int cap)
{
    int n = 0;
#define ADD(a, b) (n < cap ? (u1[n] = (a), u2[n] = (b), n++) : 0)
    for (int i = 0; i < 128; i++)
        for (int e = 0; e < 54; e += 7)
            ADD(ldexp(0x1.6p-1 + (i + 0.5) * (0x1.6p0 - 0x1.6p-1) / 128, -e - 1), 0.3);
    const double near1[] = {1.0, 0x1.fffffffffffffp-1, 1.0 - 0x1p-4, 0x1.dffffffffffffp-1, 0.97, 0.999, 0x1p-54,
                            0x1.0000000000001p-54, 0.5, 0.25, 0x1.6p-1, 0x1.5ffffffffffffp-1};
    for (size_t i = 0; i < sizeof near1 / sizeof *near1; i++) ADD(near1[i], 0.7);
    const double th[] = {0x1p-27, 0x1.2p-27, 0x1p-28, 1e-12, 0.126, 0.1259999, 0.1260001, 0.855469, 0.8554, 0.8555,
                         2.426265, 2.4262, 2.4263, M_PI_2, M_PI, 3 * M_PI_2, 2 * M_PI, M_PI_4, 3 * M_PI_4,
                         5 * M_PI_4, 7 * M_PI_4, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.2831853, 1e-3, 0.05, 0.6, 1.2, 1.7};
    for (size_t i = 0; i < sizeof th / sizeof *th; i++)
        for (int d = -2; d <= 2; d++) {
            double u = u_for_angle(th[i]) * (1 + d * 0x1p-52);
            if (u > 0 && u <= 1) ADD(0.6, u);
        }
    ADD(0.6, 1.0);
    for (int k = 0; k < 110; k++)
        for (int d = -1; d <= 1; d++) {
            const double off = k / 128.0 + d / 256.0 + 1e-7;
            ADD(0.4, u_for_angle(off));              /* range A */
            ADD(0.4, u_for_angle(M_PI_2 - off));     /* range B */
            ADD(0.4, u_for_angle(M_PI + off));       /* range C, quadrants 2 and 3 */
            ADD(0.4, u_for_angle(3 * M_PI_2 - off)); /* range C */
            ADD(0.4, u_for_angle(M_PI_2 + off));     /* range C, quadrant 1 */
        }
#undef ADD
    return n;
}

/* The kernel of `which` (2: AVX2, 5: AVX-512) against scalar libm on the probes and n_random
 * random uniform pairs: how many outputs differ in any bit. */
static uint64_t compare(int which, uint64_t n_random, uint64_t seed)
{
    enum { NP = 64, CAP = 8192 };
    static double p1[CAP], p2[CAP];
    const int np = probes(p1, p2, CAP);
    double u1[NP], u2[NP], z0[NP], z1[NP];
    uint64_t bad = 0, s = seed * 0x9e3779b97f4a7c15ULL + 1;
    const uint64_t total = (uint64_t)np + n_random;
    int m = 0;
    for (uint64_t i = 0; i < total; i++) {
        if (i < (uint64_t)np) {
            u1[m] = p1[i];
            u2[m] = p2[i];
        } else { /* uniforms exactly as the generator makes them */
            u1[m] = fs_rng_uniform(s, i, 0);
            u2[m] = fs_rng_uniform(s, i, 1);
        }
        if (++m < NP && i + 1 < total) continue;
        while (m % 8) u1[m] = 0.5, u2[m] = 0.25, m++;
#if FS_RNG_HAVE_AVX2
        for (int j = 0; j < m; j += 8) {
            if (which == 5) boxmuller_arrays_avx512(u1 + j, u2 + j, z0 + j, z1 + j);
            else boxmuller_arrays_avx2(u1 + j, u2 + j, z0 + j, z1 + j), boxmuller_arrays_avx2(u1 + j + 4, u2 + j + 4, z0 + j + 4, z1 + j + 4);
        }
#endif
        for (int j = 0; j < m; j++) {
            /* fs_rng_normal uses sin() and cos(), fs_rng_normal_fill_scalar uses sincos(): both */
            const double r = sqrt(-2.0 * log(u1[j])), th = 6.283185307179586476925 * u2[j];
            double sv, cv;
            sincos(th, &sv, &cv);
            if (!same(z0[j], r * cos(th)) || !same(z1[j], r * sin(th)) || !same(z0[j], r * cv) || !same(z1[j], r * sv))
                bad++;
        }
        m = 0;
    }
    return bad;
}

static int isa_ok = 0; /* 0: scalar libm, 2: AVX2, 5: AVX-512 */
static pthread_once_t fast_once = PTHREAD_ONCE_INIT;

static void fast_init(void)
{
#if FS_RNG_HAVE_AVX2
    if (getenv("FLUX_SIM_SCALAR_RNG")) return; /* forces the libm path (comparisons) */
    if (!cpu_has_avx2() || !load_sincostab()) return;
    /* ~15 ms: the branch probes plus 16 Ki random pairs per kernel */
    if (compare(2, 1 << 14, 12345)) return;
    isa_ok = 2;
    if (cpu_has_avx512() && !getenv("FLUX_SIM_RNG_NO_AVX512") && !compare(5, 1 << 14, 54321)) isa_ok = 5;
#endif
}

int fs_rng_fast_enabled(void)
{
    pthread_once(&fast_once, fast_init);
    return isa_ok != 0;
}

const char *fs_rng_fast_isa(void)
{
    fs_rng_fast_enabled();
    return isa_ok == 5 ? "avx512" : isa_ok == 2 ? "avx2" : "libm";
}

int fs_rng_fast_check(uint64_t n_random, uint64_t seed, uint64_t *mismatches)
{
    *mismatches = 0;
    if (!fs_rng_fast_enabled()) return -1;
    *mismatches = compare(2, n_random, seed);
    if (isa_ok == 5) *mismatches += compare(5, n_random, seed + 1);
    return 0;
}

int fs_rng_fast_pairs(uint64_t key, uint64_t k0, int64_t npairs, double *out)
{
    if (!fs_rng_fast_enabled()) return -1;
#if FS_RNG_HAVE_AVX2
    const int nl = isa_ok == 5 ? 8 : 4;
    const int64_t nv = npairs / nl;
    if (nv) {
        if (nl == 8) pairs_avx512(key, k0, nv, out);
        else pairs_avx2(key, k0, nv, out);
    }
    if (npairs % nl) { /* the tail through a scratch vector's worth of pairs */
        double tmp[16];
        if (nl == 8) pairs_avx512(key, k0 + (uint64_t)(nl * nv), 1, tmp);
        else pairs_avx2(key, k0 + (uint64_t)(nl * nv), 1, tmp);
        memcpy(out + 2 * nl * nv, tmp, (size_t)(npairs % nl) * 2 * sizeof(double));
    }
    return 0;
#else
    (void)key, (void)k0, (void)npairs, (void)out;
    return -1;
#endif
}
