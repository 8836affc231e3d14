/* Triton custom batching strategy for the encoder: a batch holds at most `max_batch_tokens` padded tokens.
 *
 * Triton's dynamic batcher caps batches by rows (max_batch_size). Rows are a poor bound for an encoder: 256 short
 * queries are cheap, 256 texts of 8192 tokens are not. Triton 24.07 lets a model supply this library
 * (batchstrategy.so in the model folder, core backend_model.cc) and asks it, request by request, whether the next
 * queued request still fits the batch being formed. build/export.py compiles this file into
 * <encoder>/batchstrategy.so and writes max_batch_tokens into the encoder's config.pbtxt.
 *
 * A request's size is rows x padded width of its input_ids. The first request of a batch is always taken: this
 * library cannot refuse a request. Triton core r24.07 (dynamic_batch_scheduler.cc, CustomBatchIncl) only logs an
 * error returned here and goes on with should_include as set; should_include = false for a batch's first request
 * leaves it at the head of the queue, re-asked in a busy loop, and stalls the model until the request's timeout.
 * A request over the budget is refused by the encoder graph instead (build/exporting/graph.py, add_token_guard),
 * which holds in the C++ onnxruntime backend too; the tokenizer never sends one.
 *
 * A batch keeps growing after Triton has queued it for the instance (the encoder has no queue policy, so the batcher
 * prefetches: core PR #237), and Triton restarts this library's state on every pass over the queue
 * (dynamic_batch_scheduler.cc: CustomBatchFini when a batch is queued, Fini + Init when a pass starts, as the queue's
 * cursor is never valid without timeouts). A fresh state would take a whole budget more into a queued batch (measured:
 * 250 of 300 requests of 4 x 256 tokens refused by the guard). So a state carries the tokens of the batch it
 * continues: Triton initializes the same payload (the same `userp` slot) right after finalizing a state that was
 * asked about requests. A new payload is initialized twice (NewPayload, then the pass's Fini + Init with no request
 * asked in between): its second state starts empty even when the payload object is a recycled one.
 *
 * The few Triton C API declarations this needs are written out here (tritonbackend.h / tritonserver.h, API 1.19):
 * the library is built with nothing but a C compiler, and its symbols resolve against the running tritonserver.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONSERVER_Message TRITONSERVER_Message;
typedef struct TRITONBACKEND_Batcher TRITONBACKEND_Batcher;
typedef struct TRITONBACKEND_Input TRITONBACKEND_Input;
typedef struct TRITONBACKEND_Model TRITONBACKEND_Model;
typedef struct TRITONBACKEND_Request TRITONBACKEND_Request;
typedef int TRITONSERVER_DataType; /* a C enum */

extern TRITONSERVER_Error* TRITONBACKEND_ModelConfig(
    TRITONBACKEND_Model* model, const uint32_t config_version, TRITONSERVER_Message** model_config);
extern TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(
    TRITONSERVER_Message* message, const char** base, size_t* byte_size);
extern TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message);
extern TRITONSERVER_Error* TRITONBACKEND_RequestInput(
    TRITONBACKEND_Request* request, const char* name, TRITONBACKEND_Input** input);
extern TRITONSERVER_Error* TRITONBACKEND_InputProperties(
    TRITONBACKEND_Input* input, const char** name, TRITONSERVER_DataType* datatype, const int64_t** shape,
    uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count);
extern void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error);

#define DEFAULT_BUDGET 16384

typedef struct Batcher Batcher;

typedef struct {
  Batcher* batcher;
  uint64_t used;
  bool empty;
  void** payload; /* the payload's user-pointer slot this state was created for */
  bool asked;     /* IncludeRequest was called with it */
} Batch;

/* One per model; r24.07 runs one batcher thread per dynamically batched model (backend_model.cc), so the calls
 * below come one at a time. */
struct Batcher {
  uint64_t budget;      /* max_batch_tokens of the model's config */
  Batch* open;          /* the state initialized last, while not finalized */
  Batch last_finalized; /* what it left for a pass that continues its payload */
};

/* The value of parameters { key: "max_batch_tokens" value: { string_value: "N" } } in the config's JSON form. */
static uint64_t
read_budget(TRITONBACKEND_Model* model)
{
  uint64_t budget = DEFAULT_BUDGET;
  TRITONSERVER_Message* config = NULL;
  const char* json = NULL;
  size_t size = 0;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelConfig(model, 1, &config);
  if (error == NULL) {
    error = TRITONSERVER_MessageSerializeToJson(config, &json, &size);
  }
  if (error == NULL) {
    const char* key = strstr(json, "\"max_batch_tokens\"");
    const char* value = key ? strstr(key, "\"string_value\":\"") : NULL;
    if (value != NULL) {
      uint64_t parsed = strtoull(value + strlen("\"string_value\":\""), NULL, 10);
      if (parsed > 0) {
        budget = parsed;
      }
    }
  } else {
    TRITONSERVER_ErrorDelete(error);
  }
  if (config != NULL) {
    TRITONSERVER_MessageDelete(config);
  }
  return budget;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher, TRITONBACKEND_Model* model)
{
  Batcher* state = calloc(1, sizeof(Batcher));
  state->budget = read_budget(model);
  *batcher = (TRITONBACKEND_Batcher*)state;
  return NULL;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher)
{
  free(batcher);
  return NULL;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher, void** userp)
{
  Batcher* owner = (Batcher*)batcher; /* Triton passes it const; this library owns it */
  if (owner->open != NULL) { /* its payload went to the instance while growing: Triton drops it without Fini */
    free(owner->open);
  }
  Batch* batch = calloc(1, sizeof(Batch));
  batch->batcher = owner;
  batch->empty = true;
  batch->payload = userp;
  if (owner->last_finalized.asked && owner->last_finalized.payload == userp) { /* a new pass, same queued payload */
    batch->used = owner->last_finalized.used;
    batch->empty = owner->last_finalized.empty;
  }
  owner->last_finalized.asked = false;
  owner->open = batch;
  *userp = batch;
  return NULL;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request, void* userp, bool* should_include)
{
  Batch* batch = userp;
  batch->asked = true;
  TRITONBACKEND_Input* input = NULL;
  const int64_t* shape = NULL;
  uint32_t dims = 0;
  uint64_t tokens = 1;
  TRITONSERVER_Error* error = TRITONBACKEND_RequestInput(request, "input_ids", &input);
  if (error == NULL) {
    error = TRITONBACKEND_InputProperties(input, NULL, NULL, &shape, &dims, NULL, NULL);
  }
  if (error != NULL) { /* cannot size it: let Triton's own checks answer it, alone */
    TRITONSERVER_ErrorDelete(error);
    *should_include = batch->empty;
    batch->empty = false;
    return NULL;
  }
  for (uint32_t i = 0; i < dims; i++) {
    tokens *= (uint64_t)shape[i];
  }
  *should_include = batch->empty || batch->used + tokens <= batch->batcher->budget;
  if (*should_include) {
    batch->used += tokens;
    batch->empty = false;
  }
  return NULL;
}

TRITONSERVER_Error*
TRITONBACKEND_ModelBatchFinalize(void* userp)
{
  Batch* batch = userp;
  batch->batcher->last_finalized = *batch;
  if (batch->batcher->open == batch) {
    batch->batcher->open = NULL;
  }
  free(batch);
  return NULL;
}
