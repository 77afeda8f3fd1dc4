/*
 * example.c: run a Kiln artifact from C.
 *
 *   example MODEL.kiln [-p PROFILE] [INPUT ...]
 *
 * Runs the artifact's profile PROFILE (default 0; `kiln compile --dim
 * batch=1,8` makes one per batch size) through the shaped entry point,
 * which takes each input's dims and returns each output's. Each INPUT is,
 * in the model's declared input order, either a file of raw little-endian
 * tensor bytes (exactly the input's byte size in that profile) or "-" to
 * fill that input with a fixed pattern. Inputs not given are filled with
 * the pattern. Prints every output's name, type and first values.
 *
 * Build (from the workspace root, after `cargo build -p kiln-runtime`):
 *   gcc -std=c11 -Wall -Wextra -I runtime/include tests/c/example.c \
 *       target/debug/libkiln_runtime.a -lm -lpthread -ldl -o example
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

static const char *dtype_name(int dtype) {
    static const char *names[] = {"?", "f32", "f16", "bf16", "f64", "i8",
                                  "u8", "i16", "i32", "i64", "bool"};
    return dtype >= 1 && dtype <= 10 ? names[dtype] : "?";
}

static size_t dtype_size(int dtype) {
    switch (dtype) {
    case KILN_DTYPE_F64: case KILN_DTYPE_I64: return 8;
    case KILN_DTYPE_F32: case KILN_DTYPE_I32: return 4;
    case KILN_DTYPE_F16: case KILN_DTYPE_BF16: case KILN_DTYPE_I16: return 2;
    default: return 1;
    }
}

/* Fills a buffer with a deterministic pattern: element k is (k % 7) * 0.25
 * for floats (f16/bf16 get raw byte patterns), k % 7 for integers. */
static void fill_pattern(unsigned char *buf, size_t size, int dtype) {
    size_t n = size / dtype_size(dtype);
    for (size_t k = 0; k < n; k++) {
        double v = (double)(k % 7);
        switch (dtype) {
        case KILN_DTYPE_F32: { float f = (float)(v * 0.25); memcpy(buf + 4 * k, &f, 4); break; }
        case KILN_DTYPE_F64: { double d = v * 0.25; memcpy(buf + 8 * k, &d, 8); break; }
        case KILN_DTYPE_I32: { int32_t i = (int32_t)v; memcpy(buf + 4 * k, &i, 4); break; }
        case KILN_DTYPE_I64: { int64_t i = (int64_t)v; memcpy(buf + 8 * k, &i, 8); break; }
        case KILN_DTYPE_I16: { int16_t i = (int16_t)v; memcpy(buf + 2 * k, &i, 2); break; }
        case KILN_DTYPE_BOOL: buf[k] = (unsigned char)(k % 2); break;
        default: memset(buf + dtype_size(dtype) * k, (int)(k % 7), dtype_size(dtype)); break;
        }
    }
}

static int read_file(const char *path, unsigned char *buf, size_t size) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); return -1; }
    size_t got = fread(buf, 1, size, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != size || extra != EOF) {
        fprintf(stderr, "%s: expected exactly %zu bytes\n", path, size);
        return -1;
    }
    return 0;
}

static void print_value(const unsigned char *p, int dtype) {
    switch (dtype) {
    case KILN_DTYPE_F32: { float f; memcpy(&f, p, 4); printf("%g", f); break; }
    case KILN_DTYPE_F64: { double d; memcpy(&d, p, 8); printf("%g", d); break; }
    case KILN_DTYPE_I32: { int32_t i; memcpy(&i, p, 4); printf("%d", i); break; }
    case KILN_DTYPE_I64: { int64_t i; memcpy(&i, p, 8); printf("%lld", (long long)i); break; }
    case KILN_DTYPE_I16: { int16_t i; memcpy(&i, p, 2); printf("%d", i); break; }
    case KILN_DTYPE_I8: printf("%d", (signed char)p[0]); break;
    case KILN_DTYPE_F16: case KILN_DTYPE_BF16: printf("0x%02x%02x", p[1], p[0]); break;
    default: printf("%u", p[0]); break;
    }
}

static void print_type(int dtype, const uint64_t *dims, int64_t rank) {
    printf("%s[", dtype_name(dtype));
    for (int64_t d = 0; d < rank; d++) printf(d ? ",%llu" : "%llu", (unsigned long long)dims[d]);
    printf("]");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.kiln [-p PROFILE] [INPUT|- ...]\n", argv[0]);
        return 2;
    }
    size_t profile = 0;
    int first_input = 2;
    if (argc > 3 && strcmp(argv[2], "-p") == 0) {
        profile = (size_t)strtoul(argv[3], NULL, 10);
        first_input = 4;
    }
    KilnModel *m = kiln_model_load(argv[1]);
    if (!m) {
        fprintf(stderr, "error: %s\n", kiln_last_error());
        return 1;
    }
    /* The artifact's golden self-test (kiln compile --golden), when it has
     * one: its stored inputs, checked against the source model's outputs. */
    int verified = kiln_model_verify(m);
    if (verified == KILN_OK) {
        printf("golden self-test: every output within tolerance\n");
    } else if (verified == KILN_VERIFY_FAILED) {
        fprintf(stderr, "error: %s\n", kiln_last_error());
        kiln_model_free(m);
        return 1;
    }
    size_t n_in = kiln_model_num_inputs(m), n_out = kiln_model_num_outputs(m);
    size_t n_profiles = kiln_model_num_profiles(m);
    void **inputs = calloc(n_in + 1, sizeof *inputs);
    uint64_t **in_dims = calloc(n_in + 1, sizeof *in_dims);
    void **outputs = calloc(n_out + 1, sizeof *outputs);
    size_t *capacity = calloc(n_out + 1, sizeof *capacity);
    uint64_t **out_dims = calloc(n_out + 1, sizeof *out_dims);
    int status = 1;
    if (!inputs || !in_dims || !outputs || !capacity || !out_dims) goto done;
    if (profile >= n_profiles) {
        fprintf(stderr, "error: profile %zu, but the artifact has %zu\n", profile, n_profiles);
        goto done;
    }
    printf("profile %zu of %zu\n", profile, n_profiles);

    for (size_t i = 0; i < n_in; i++) {
        int dtype = kiln_model_input_dtype(m, i);
        int64_t rank = kiln_model_input_rank(m, i);
        in_dims[i] = calloc((size_t)rank + 1, sizeof **in_dims);
        if (!in_dims[i] || kiln_model_profile_input_dims(m, profile, i, in_dims[i]) != 0) goto done;
        size_t size = dtype_size(dtype);
        for (int64_t d = 0; d < rank; d++) size *= (size_t)in_dims[i][d];
        inputs[i] = malloc(size ? size : 1);
        if (!inputs[i]) goto done;
        const char *src = (int)i + first_input < argc ? argv[i + first_input] : "-";
        if (strcmp(src, "-") == 0) {
            fill_pattern(inputs[i], size, dtype);
        } else if (read_file(src, inputs[i], size) != 0) {
            goto done;
        }
        printf("input  %s: %s, %zu bytes from %s\n", kiln_model_input_name(m, i),
               dtype_name(dtype), size, strcmp(src, "-") ? src : "pattern");
    }
    /* Buffers that fit output i in every profile; the run writes the
     * actual dims. */
    for (size_t i = 0; i < n_out; i++) {
        int64_t size = kiln_model_output_max_byte_size(m, i);
        capacity[i] = (size_t)size;
        outputs[i] = malloc(size ? (size_t)size : 1);
        out_dims[i] = calloc((size_t)kiln_model_output_rank(m, i) + 1, sizeof **out_dims);
        if (!outputs[i] || !out_dims[i]) goto done;
    }

    /* A session owns the arena one inference works in; one per thread lets
     * several threads run the same loaded model at once. With two threads,
     * the steps the compiler split into tasks run on both. */
    KilnSession *s = kiln_session_new_threads(m, 2);
    if (!s) {
        fprintf(stderr, "error: %s\n", kiln_last_error());
        goto done;
    }
    int rc = kiln_session_run_shaped(s, (const uint64_t *const *)in_dims,
                                     (const void *const *)inputs, outputs, capacity, out_dims);
    kiln_session_free(s);
    if (rc != KILN_OK) {
        fprintf(stderr, "error: %s\n", kiln_last_error());
        goto done;
    }

    for (size_t i = 0; i < n_out; i++) {
        int dtype = kiln_model_output_dtype(m, i);
        int64_t rank = kiln_model_output_rank(m, i);
        size_t n = 1;
        for (int64_t d = 0; d < rank; d++) n *= (size_t)out_dims[i][d];
        printf("output %s: ", kiln_model_output_name(m, i));
        print_type(dtype, out_dims[i], rank);
        printf(" =");
        for (size_t k = 0; k < n && k < 8; k++) {
            printf(" ");
            print_value((const unsigned char *)outputs[i] + k * dtype_size(dtype), dtype);
        }
        printf(n > 8 ? " ...\n" : "\n");
    }
    status = 0;

done:
    for (size_t i = 0; inputs && i < n_in; i++) free(inputs[i]);
    for (size_t i = 0; in_dims && i < n_in; i++) free(in_dims[i]);
    for (size_t i = 0; outputs && i < n_out; i++) free(outputs[i]);
    for (size_t i = 0; out_dims && i < n_out; i++) free(out_dims[i]);
    free(inputs);
    free(in_dims);
    free(outputs);
    free(capacity);
    free(out_dims);
    kiln_model_free(m);
    return status;
}
