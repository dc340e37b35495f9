/* test_quant.c — MLX affine quantization reference: packing convention and round trip, negative scales,
 * zero groups, reproduction of the fixture's q4/q8 files with the min/max rule, and the MLX rule vs the
 * min/max rule in whole-model weight error. */
#include <stdlib.h>
#include <string.h>

#include "io/weights.h"
#include "quant/dequant.h"
#include "quant/mlx_affine.h"
#include "test.h"

/* The fixture files were produced by the min/max rule in float32 (numpy/torch); a different order of
 * operations can flip a value that sits exactly on a rounding boundary, so allow 0.1% of weights to differ. */
#define MIN_MATCH_FRACTION 0.999

static uint32_t lcg(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s >> 8; }

static const char *lin_names[] = {"context_embedder", "x_embedder", "proj_out", "norm_out.linear",
    "double_stream_modulation_img.linear", "double_stream_modulation_txt.linear", "single_stream_modulation.linear",
    "time_guidance_embed.timestep_embedder.linear_1", "time_guidance_embed.timestep_embedder.linear_2",
    "transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k", "transformer_blocks.0.attn.to_v",
    "transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.attn.add_q_proj", "transformer_blocks.0.attn.add_k_proj",
    "transformer_blocks.0.attn.add_v_proj", "transformer_blocks.0.attn.to_add_out", "transformer_blocks.0.ff.linear_in",
    "transformer_blocks.0.ff.linear_out", "transformer_blocks.0.ff_context.linear_in", "transformer_blocks.0.ff_context.linear_out",
    "single_transformer_blocks.0.attn.to_qkv_mlp_proj", "single_transformer_blocks.0.attn.to_out",
    "single_transformer_blocks.1.attn.to_qkv_mlp_proj", "single_transformer_blocks.1.attn.to_out"};
#define NLIN ((int)(sizeof lin_names / sizeof lin_names[0]))

static void round_trip(int bits, int group) {
    char name[96];
    const int in = 256, per = 32 / bits, nb = (1 << bits) - 1;
    float w[256], back[256];
    uint8_t q[256];
    uint32_t packed[256], seed = 12345u + (uint32_t)bits;
    uint16_t sc[8], bi[8];
    /* exactly representable rows: w = s*q + b with s a power of two and b a bf16 value; each group holds 0 and nb */
    for (int g = 0; g < in / group; g++) {
        float s = ldexpf(1.0f, -3 - g), b = dt_bf16_round(-0.37f * (float)(g + 1));
        for (int j = 0; j < group; j++) {
            int v = (int)(lcg(&seed) % (uint32_t)(nb + 1));
            if (j == 0) v = 0;
            if (j == 1) v = nb;
            q[g * group + j] = (uint8_t)v;
            w[g * group + j] = s * (float)v + b;
        }
    }
    mlx_quant_row(w, in, bits, group, MLX_RULE_MINMAX, packed, sc, bi);
    int ok = 1;
    for (int i = 0; i < in; i++) ok &= ((packed[i / per] >> ((i % per) * bits)) & (uint32_t)nb) == q[i];
    snprintf(name, sizeof name, "quant_pack_layout_bits%d_group%d", bits, group);
    T_CHECK(name, ok, "packed values differ from the element-0-in-low-bits layout");
    mlx_dequant_row(back, packed, sc, bi, DT_BF16, in, bits, group);
    snprintf(name, sizeof name, "quant_round_trip_exact_bits%d_group%d", bits, group);
    T_CHECK(name, memcmp(back, w, sizeof w) == 0, "dequantized row differs");
}

int main(void) {
    /* packing convention: q = 0,1,...,7 in one word at 4 bits -> 0x76543210 */
    {
        float w[32], back[32];
        uint32_t p[4];
        uint16_t s, b;
        for (int i = 0; i < 32; i++) w[i] = (float)(i % 8) + (i >= 8 ? 0.0f : 0.0f);
        w[31] = 15.0f; /* range [0, 15] -> scale 1, bias 0 */
        mlx_quant_row(w, 32, 4, 32, MLX_RULE_MINMAX, p, &s, &b);
        T_CHECK("quant_pack_word_0x76543210", p[0] == 0x76543210u && dt_bf16_to_f32(s) == 1.0f && dt_bf16_to_f32(b) == 0.0f,
                "word 0x%08x scale %g bias %g", p[0], dt_bf16_to_f32(s), dt_bf16_to_f32(b));
        mlx_dequant_row(back, p, &s, &b, DT_BF16, 32, 4, 32);
        T_CHECK("quant_unpack_word", memcmp(back, w, sizeof w) == 0, "unpack");
        uint32_t p8[8];
        mlx_quant_row(w, 32, 8, 32, MLX_RULE_MINMAX, p8, &s, &b);
        /* 8 bits: scale (15-0)/255 -> q = round(w*17) */
        T_CHECK("quant_pack8_word", (p8[0] & 0xff) == 0 && ((p8[0] >> 8) & 0xff) == 17 && ((p8[0] >> 24) & 0xff) == 51,
                "word 0x%08x", p8[0]);
    }
    round_trip(4, 32);
    round_trip(4, 64);
    round_trip(8, 32);
    round_trip(8, 128);
    round_trip(2, 64);

    /* negative scales: hand-made group, bf16 / f16 / f32 scale storage */
    {
        uint32_t p[4] = {0x76543210u, 0xfedcba98u, 0, 0};
        float out[32];
        uint16_t sb[2] = {dt_f32_to_bf16(-0.5f), dt_f32_to_bf16(3.0f)};
        mlx_dequant_row(out, p, &sb[0], &sb[1], DT_BF16, 32, 4, 32);
        T_CHECK("quant_negative_scale_bf16", out[0] == 3.0f && out[1] == 2.5f && out[15] == -4.5f && out[16] == 3.0f, "values");
        uint16_t hb[2] = {dt_f32_to_f16(-0.5f), dt_f32_to_f16(3.0f)};
        mlx_dequant_row(out, p, &hb[0], &hb[1], DT_F16, 32, 4, 32);
        T_CHECK("quant_negative_scale_f16", out[15] == -4.5f, "f16");
        float fs = -0.5f, fb = 3.0f;
        mlx_dequant_row(out, p, &fs, &fb, DT_F32, 32, 4, 32);
        T_CHECK("quant_negative_scale_f32", out[15] == -4.5f, "f32");
    }
    /* MLX rule picks a negative scale when the max has the larger magnitude, and that edge is exact */
    {
        float w[64], back[64];
        uint32_t p[8];
        uint16_t s[2], b[2];
        uint32_t seed = 7;
        for (int i = 0; i < 64; i++) w[i] = dt_bf16_round(((float)(lcg(&seed) % 1000) / 1000.0f) * 1.2f - 0.1f);
        w[3] = dt_bf16_round(1.1f);   /* group 0: |max| > |min| */
        w[4] = dt_bf16_round(-0.1f);
        for (int i = 32; i < 64; i++) w[i] = -w[i - 32];  /* group 1: |min| > |max| */
        mlx_quant_row(w, 64, 4, 32, MLX_RULE_MLX, p, s, b);
        mlx_dequant_row(back, p, s, b, DT_BF16, 64, 4, 32);
        float s0 = dt_bf16_to_f32(s[0]), s1 = dt_bf16_to_f32(s[1]);
        double maxerr = 0;
        for (int i = 0; i < 64; i++) {
            double e = fabs((double)back[i] - w[i]) / fabs(i < 32 ? s0 : s1);
            if (e > maxerr) maxerr = e;
        }
        T_CHECK("quant_mlx_rule_negative_scale", s0 < 0 && s1 > 0 && back[3] == w[3] && back[35] == w[35] &&
                dt_bf16_to_f32(b[0]) == w[3], "scales %g %g, edge %g -> %g, bias %g", s0, s1, w[3], back[3], dt_bf16_to_f32(b[0]));
        /* half a step, plus a little for the bf16 rounding of the stored scale times up to 15 steps */
        T_CHECK("quant_mlx_rule_error_bound", maxerr <= 0.5 + 15 * 0.004, "max error %.3f steps", maxerr);
    }
    /* all-zero group: both rules give exact zeros */
    {
        float z[32] = {0}, back[32];
        uint32_t p[4];
        uint16_t s, b;
        for (int rule = 0; rule < 2; rule++) {
            mlx_quant_row(z, 32, 4, 32, (mlx_rule)rule, p, &s, &b);
            mlx_dequant_row(back, p, &s, &b, DT_BF16, 32, 4, 32);
            T_CHECK(rule ? "quant_zero_group_minmax" : "quant_zero_group_mlx", memcmp(back, z, sizeof z) == 0,
                    "got %g", back[0]);
        }
    }

    /* reproduce the fixture files with the min/max rule */
    char path[512];
    snprintf(path, sizeof path, "%s/model/transformer", t_fixtures());
    dt_weights *ref = dt_weights_open(path);
    if (!ref) { T_FAIL("quant_open_fixture", "%s", dt_last_error()); return T_DONE(); }
    const int bits_list[2] = {4, 8};
    double err_rule[2] = {0, 0}, den_all = 0;
    for (int bi = 0; bi < 2; bi++) {
        int bits = bits_list[bi];
        snprintf(path, sizeof path, "%s/transformer-q%d", t_fixtures(), bits);
        dt_weights *qf = dt_weights_open(path);
        if (!qf) { T_FAIL("quant_open_q", "%s", dt_last_error()); continue; }
        uint64_t total = 0, match = 0, sb_total = 0, sb_match = 0;
        int resolved = 1;
        for (int li = 0; li < NLIN; li++) {
            dt_linear_src D, Q;
            if (dt_weights_linear(ref, lin_names[li], 0, 0, 0, &D) || dt_weights_linear(qf, lin_names[li], D.out, D.in, 0, &Q)) {
                printf("  %s\n", dt_last_error());
                resolved = 0;
                continue;
            }
            const int64_t in = D.in, words = in * bits / 32, groups = in / 32;
            float *row = malloc((size_t)in * sizeof(float)), *back = malloc((size_t)in * sizeof(float));
            uint32_t *pk = malloc((size_t)words * 4);
            uint16_t *sc = malloc((size_t)groups * 2), *bs = malloc((size_t)groups * 2);
            const uint32_t mask = (1u << bits) - 1, per = (uint32_t)(32 / bits);
            for (int64_t r = 0; r < D.out; r++) {
                dt_linear_src_rows_f32(&D, r, 1, row);
                mlx_quant_row(row, in, bits, 32, MLX_RULE_MINMAX, pk, sc, bs);
                const uint32_t *fp = (const uint32_t *)Q.data + r * words;
                const uint16_t *fs = (const uint16_t *)Q.scales + r * groups, *fb = (const uint16_t *)Q.biases + r * groups;
                for (int64_t i = 0; i < in; i++) {
                    uint32_t sh = (uint32_t)(i % per) * (uint32_t)bits;
                    match += ((pk[i / per] >> sh) & mask) == ((fp[i / per] >> sh) & mask);
                }
                total += (uint64_t)in;
                for (int64_t g = 0; g < groups; g++) sb_match += (sc[g] == fs[g]) + (bs[g] == fb[g]);
                sb_total += 2 * (uint64_t)groups;
                /* whole-model error of both rules at this bit width */
                for (int rule = 0; rule < 2; rule++) {
                    mlx_quant_row(row, in, bits, 32, (mlx_rule)rule, pk, sc, bs);
                    mlx_dequant_row(back, pk, sc, bs, DT_BF16, in, bits, 32);
                    for (int64_t i = 0; i < in; i++) {
                        double d = (double)back[i] - row[i];
                        if (bits == 4) err_rule[rule] += d * d;
                    }
                }
                if (bits == 4) for (int64_t i = 0; i < in; i++) den_all += (double)row[i] * row[i];
            }
            free(row); free(back); free(pk); free(sc); free(bs);
        }
        char name[96];
        double frac = total ? (double)match / (double)total : 0, sfrac = sb_total ? (double)sb_match / (double)sb_total : 0;
        printf("INFO q%d fixture reproduction: %.4f%% of %llu weights match, %.4f%% of scales+biases equal\n", bits,
               100 * frac, (unsigned long long)total, 100 * sfrac);
        snprintf(name, sizeof name, "quant_reproduces_fixture_q%d_weights", bits);
        T_CHECK(name, resolved && frac >= MIN_MATCH_FRACTION, "%.4f%% match (< %.1f%%)", 100 * frac, 100 * MIN_MATCH_FRACTION);
        snprintf(name, sizeof name, "quant_reproduces_fixture_q%d_scales_biases", bits);
        T_CHECK(name, resolved && sb_match == sb_total, "%llu of %llu differ", (unsigned long long)(sb_total - sb_match),
                (unsigned long long)sb_total);
        dt_weights_close(qf);
    }
    double e_mlx = sqrt(err_rule[MLX_RULE_MLX] / den_all), e_mm = sqrt(err_rule[MLX_RULE_MINMAX] / den_all);
    printf("INFO 4-bit whole-model relative weight error: MLX rule %.5f, min/max rule %.5f\n", e_mlx, e_mm);
    /* both are uniform quantizers with the same step size, so their errors must be close (within 10%) */
    T_CHECK("quant_mlx_vs_minmax_error", e_mlx < 0.1 && e_mm < 0.1 && fabs(e_mlx - e_mm) < 0.1 * e_mm, "mlx %.4g minmax %.4g",
            e_mlx, e_mm);
    dt_weights_close(ref);
    return T_DONE();
}
