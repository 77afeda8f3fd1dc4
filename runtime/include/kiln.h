/*
 * kiln.h: C interface of the Kiln runtime (kiln-runtime, src/capi.rs).
 *
 * Link against the static library (libkiln_runtime.a, plus -lm -lpthread
 * -ldl) or the shared library (libkiln_runtime.so).
 *
 * A KilnModel is a loaded, ready-to-run artifact. Functions that fail record
 * a message readable with kiln_last_error() on the same thread.
 *
 * Threads: a KilnModel is immutable once loaded (code, weights, metadata)
 * and may be used from many threads at once. A KilnSession owns the memory
 * one inference works in (the arena); create one per thread with
 * kiln_session_new() for runs that never allocate. kiln_model_run() is the
 * simple entry point: it uses the model's own arena, or a temporary one
 * while another thread's call holds it.
 *
 * An artifact is machine code: load only artifacts you trust, as you would a
 * shared library.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (the artifact format's dtype codes). */
#define KILN_DTYPE_F32 1
#define KILN_DTYPE_F16 2
#define KILN_DTYPE_BF16 3
#define KILN_DTYPE_F64 4
#define KILN_DTYPE_I8 5
#define KILN_DTYPE_U8 6
#define KILN_DTYPE_I16 7
#define KILN_DTYPE_I32 8
#define KILN_DTYPE_I64 9
#define KILN_DTYPE_BOOL 10
#define KILN_DTYPE_U16 11
#define KILN_DTYPE_U32 12
#define KILN_DTYPE_U64 13
#define KILN_DTYPE_F8E4M3FN 14
#define KILN_DTYPE_F8E4M3FNUZ 15
#define KILN_DTYPE_F8E5M2 16
#define KILN_DTYPE_F8E5M2FNUZ 17
/* The 8-, 4- and 2-bit types hold one element per byte, its code in the
   low bits (not packed two or four to a byte as in ONNX files). */
#define KILN_DTYPE_F4E2M1 18
#define KILN_DTYPE_I4 19
#define KILN_DTYPE_U4 20
#define KILN_DTYPE_I2 21
#define KILN_DTYPE_U2 22

/* Results of kiln_model_run. */
#define KILN_OK 0
#define KILN_ERROR_ARGUMENT 1 /* NULL model, array or buffer */
#define KILN_ERROR_KERNEL 2   /* a kernel reported an error */
#define KILN_ERROR_INTERNAL 3 /* a bug in the runtime */
#define KILN_ERROR_OUT_OF_MEMORY 4 /* kiln_model_run: no memory for a temporary arena */

typedef struct KilnModel KilnModel;
typedef struct KilnSession KilnSession;

/* Loads, validates and prepares the artifact at `path` (UTF-8).
 * Returns NULL on failure; see kiln_last_error(). */
KilnModel *kiln_model_load(const char *path);

/* Like kiln_model_load, but only loads the artifact if its detached
 * signature (`path` + ".sig", written by `kiln compile --sign KEY`) is a
 * valid Ed25519 signature by the public key in `public_key_pem` (PEM text,
 * "-----BEGIN PUBLIC KEY-----", from `kiln keygen` or `openssl pkey
 * -pubout`). An unsigned artifact, one modified after signing and one
 * signed with another key all return NULL. Not present when the runtime is
 * built without its `signing` feature. See docs/security.md. */
KilnModel *kiln_model_load_verified(const char *path, const char *public_key_pem);

/* Frees a model; NULL is ignored. */
void kiln_model_free(KilnModel *m);

/* The message of the most recent failure on this thread, or NULL if there
 * was none. Valid until the next failing call on this thread. */
const char *kiln_last_error(void);

/* Inputs and outputs, in declared order. Indices run from 0 to
 * num_inputs - 1 (num_outputs - 1). On a bad index or NULL model: names
 * are NULL, dtype 0, rank and byte size -1, dims returns -1. */
size_t kiln_model_num_inputs(const KilnModel *m);
const char *kiln_model_input_name(const KilnModel *m, size_t i); /* valid while m lives */
int kiln_model_input_dtype(const KilnModel *m, size_t i);        /* KILN_DTYPE_* */
int64_t kiln_model_input_rank(const KilnModel *m, size_t i);
int kiln_model_input_dims(const KilnModel *m, size_t i, uint64_t *out); /* room for rank values; 0 = ok */
int64_t kiln_model_input_byte_size(const KilnModel *m, size_t i);

size_t kiln_model_num_outputs(const KilnModel *m);
const char *kiln_model_output_name(const KilnModel *m, size_t i);
int kiln_model_output_dtype(const KilnModel *m, size_t i);
int64_t kiln_model_output_rank(const KilnModel *m, size_t i);
int kiln_model_output_dims(const KilnModel *m, size_t i, uint64_t *out);
int64_t kiln_model_output_byte_size(const KilnModel *m, size_t i);

/* Runs one inference. inputs[i] points to the data of input i and
 * outputs[i] to a buffer for output i, in declared order, each exactly
 * kiln_model_*_byte_size bytes of dense, row-major, little-endian elements.
 * Returns KILN_OK or a KILN_ERROR_* code (see kiln_last_error()).
 * Thread-safe; allocates only when another thread's call holds the model's
 * arena. */
int kiln_model_run(const KilnModel *m, const void *const *inputs, void *const *outputs);

/* Shape profiles (kiln compile --dim batch=1,8,32): one artifact holds one
 * specialization per combination of input shapes, and a run's input shapes
 * pick it. The accessors above describe profile 0; kiln_model_run and
 * kiln_session_run run profile 0 with buffers of its exact sizes.
 *
 * A model whose If or Loop decides on run-time values has one profile per
 * path (a variant) and one condition program per decision: every run
 * computes the conditions first and runs the variant they select, whose
 * outputs may have other shapes than profile 0's. kiln_model_run then
 * fails with KILN_ERROR_ARGUMENT naming kiln_model_run_shaped, which
 * reports each output's dims; a path the compiler could not build is
 * KILN_ERROR_ARGUMENT with the reason (docs/profiles.md). */

/* Number of profiles (at least 1); 0 if m is NULL. */
size_t kiln_model_num_profiles(const KilnModel *m);

/* Writes the dims of input i in profile p to out (room for the input's
 * rank); 0 = ok, -1 on a NULL model or a bad index. */
int kiln_model_profile_input_dims(const KilnModel *m, size_t p, size_t i, uint64_t *out);

/* The largest byte size output i has in any profile (a buffer this large
 * fits every run), or -1 on error. */
int64_t kiln_model_output_max_byte_size(const KilnModel *m, size_t i);

/* Runs one inference on inputs of any profile's shapes. input_dims[i]
 * points to the dims of input i (kiln_model_input_rank values); together
 * they pick the profile. outputs[i] is a buffer of output_capacity[i]
 * bytes, at least output i's size in that profile. Output i's dims are
 * written to output_dims[i] (room for kiln_model_output_rank values)
 * unless output_dims or output_dims[i] is NULL. Shapes no profile has:
 * KILN_ERROR_ARGUMENT, and kiln_last_error() lists the profiles.
 * An output whose size depends on the data (NonZero, NonMaxSuppression,
 * ...; docs/bounded.md) needs a capacity of its bound, the size the
 * accessors above give; the run writes its data at the buffer's start and
 * its dims to output_dims. kiln_model_run refuses such a model with
 * KILN_ERROR_ARGUMENT. Thread-safe like kiln_model_run. */
int kiln_model_run_shaped(const KilnModel *m, const uint64_t *const *input_dims,
                          const void *const *inputs, void *const *outputs,
                          const size_t *output_capacity, uint64_t *const *output_dims);

/* As kiln_model_run_shaped, in the session's arena (sized for the largest
 * profile); does not allocate. */
int kiln_session_run_shaped(KilnSession *s, const uint64_t *const *input_dims,
                            const void *const *inputs, void *const *outputs,
                            const size_t *output_capacity, uint64_t *const *output_dims);

/* Result of kiln_model_verify: a golden output is beyond its tolerance. */
#define KILN_VERIFY_FAILED 5

/* Runs the artifact's golden self-test (kiln compile --golden) on this
 * machine: every stored input set, every output against the source model's
 * value and its tolerance. Returns KILN_OK, KILN_VERIFY_FAILED (see
 * kiln_last_error() for the outputs), KILN_ERROR_ARGUMENT for an artifact
 * without a self-test, or a run's KILN_ERROR_* code. */
int kiln_model_verify(const KilnModel *m);

/* A session: an arena of the model's size (its largest profile's),
 * allocated here. Returns NULL on
 * failure; see kiln_last_error(). The session keeps the model's code and
 * weights alive, so it may be freed after the model. */
KilnSession *kiln_session_new(const KilnModel *m);

/* As kiln_session_new, with `threads` threads (the caller and threads - 1
 * workers, created here) for the steps the compiler split into independent
 * tasks; 0 and 1 mean one thread. Runs neither create threads nor
 * allocate. */
KilnSession *kiln_session_new_threads(const KilnModel *m, size_t threads);

/* Frees a session; NULL is ignored. */
void kiln_session_free(KilnSession *s);

/* Runs one inference in the session's arena; arguments and results as for
 * kiln_model_run. Does not allocate. A session must not be used by two
 * threads at once. */
int kiln_session_run(KilnSession *s, const void *const *inputs, void *const *outputs);

#ifdef __cplusplus
}
#endif

#endif /* KILN_H */
