/*
 * example.c: run a Kiln artifact from C.
 *
 *   example MODEL.kiln [INPUT ...]
 *
 * Each INPUT is, in the model's declared input order, either a file of raw
 * little-endian tensor bytes (exactly the input's byte size) or "-" to fill
 * that input with a fixed pattern. Inputs not given are filled with the
 * pattern. Prints every output's name, type and first values.
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
        fprintf(stderr, "usage: %s MODEL.kiln [INPUT|- ...]\n", argv[0]);
        return 2;
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
    void **inputs = calloc(n_in + 1, sizeof *inputs);
    void **outputs = calloc(n_out + 1, sizeof *outputs);
    int status = 1;
    if (!inputs || !outputs) goto done;

    for (size_t i = 0; i < n_in; i++) {
        size_t size = (size_t)kiln_model_input_byte_size(m, i);
        int dtype = kiln_model_input_dtype(m, i);
        inputs[i] = malloc(size ? size : 1);
        if (!inputs[i]) goto done;
        const char *src = (int)i + 2 < argc ? argv[i + 2] : "-";
        if (strcmp(src, "-") == 0) {
            fill_pattern(inputs[i], size, dtype);
        } else if (read_file(src, inputs[i], size) != 0) {
            goto done;
        }
        printf("input  %s: %s, %zu bytes from %s\n", kiln_model_input_name(m, i),
               dtype_name(dtype), size, strcmp(src, "-") ? src : "pattern");
    }
    for (size_t i = 0; i < n_out; i++) {
        int64_t size = kiln_model_output_byte_size(m, i);
        outputs[i] = malloc(size ? (size_t)size : 1);
        if (!outputs[i]) goto done;
    }

    /* A session owns the arena one inference works in; one per thread lets
     * several threads run the same loaded model at once. With two threads,
     * the steps the compiler split into tasks run on both. */
    KilnSession *s = kiln_session_new_threads(m, 2);
    if (!s) {
        fprintf(stderr, "error: %s\n", kiln_last_error());
        goto done;
    }
    int rc = kiln_session_run(s, (const void *const *)inputs, outputs);
    kiln_session_free(s);
    if (rc != KILN_OK) {
        fprintf(stderr, "error: %s\n", kiln_last_error());
        goto done;
    }

    for (size_t i = 0; i < n_out; i++) {
        int dtype = kiln_model_output_dtype(m, i);
        int64_t rank = kiln_model_output_rank(m, i);
        uint64_t *dims = calloc((size_t)rank + 1, sizeof *dims);
        if (!dims || kiln_model_output_dims(m, i, dims) != 0) { free(dims); goto done; }
        size_t n = (size_t)kiln_model_output_byte_size(m, i) / dtype_size(dtype);
        printf("output %s: ", kiln_model_output_name(m, i));
        print_type(dtype, dims, rank);
        printf(" =");
        for (size_t k = 0; k < n && k < 8; k++) {
            printf(" ");
            print_value((const unsigned char *)outputs[i] + k * dtype_size(dtype), dtype);
        }
        printf(n > 8 ? " ...\n" : "\n");
        free(dims);
    }
    status = 0;

done:
    for (size_t i = 0; inputs && i < n_in; i++) free(inputs[i]);
    for (size_t i = 0; outputs && i < n_out; i++) free(outputs[i]);
    free(inputs);
    free(outputs);
    kiln_model_free(m);
    return status;
}
