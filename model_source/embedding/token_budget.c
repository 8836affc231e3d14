/* Triton custom batching strategy for the encoder: a batch holds at most `max_batch_tokens` padded tokens (and, of
 * texts wider than ATTENTION_WIDTH, as few as keep its attention within the budget's at that width).
 *
 * Triton's dynamic batcher caps batches by rows (max_batch_size). Rows are a poor bound for an encoder: 256 short
 * queries are cheap, 256 texts of 8192 tokens are not. Triton 24.07 lets a model supply this library
 * (batchstrategy.so in the model folder, core backend_model.cc) and asks it, request by request, whether the next
 * queued request still fits the batch being formed. build/export.py compiles this file into
 * <encoder>/batchstrategy.so and writes max_batch_tokens into the encoder's config.pbtxt.
 *
 * A batch's size is its rows x its widest request's width: what the encoder pads it to. Without ragged batching every
 * request of a batch has one width, and that is the sum of rows x width; with it (an export made with
 * --ragged-batch: exporter/graph.py, add_ragged_inputs) the graph pads every row to the widest. The first request of a batch is always taken: this
 * library cannot refuse a request. Triton core r24.07 (dynamic_batch_scheduler.cc, CustomBatchIncl) only logs an
 * error returned here and goes on with should_include as set; should_include = false for a batch's first request
 * leaves it at the head of the queue, re-asked in a busy loop, and stalls the model until the request's timeout.
 * A request over the budget is refused by the encoder graph instead (exporter/graph.py, add_token_guard),
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
 * While the queued batch cannot grow (the queue's head has another shape, or is over the budget) and the instance is
 * busy, r24.07's batcher thread busy-waits: each pass adds nothing and returns no wait (GetDynamicBatch returns early
 * when nothing is pending) and the prefetch slot stays free, so the next pass starts at once. On 2 cores that thread
 * took 26-41 % of a core during 32-text requests through ensemble_bls (98 % of tritonserver's samples, perf), from
 * the encoder it waits for. So once passes over one payload have included nothing for SPIN_GRACE_NS, each Init sleeps
 * SPIN_SLEEP_NS: the thread polls instead of spinning (32-text requests through ensemble_bls at 2 clients: 30.1 ->
 * 39-45 texts/s, bench/TUNING.md). The cost: Triton holds the batcher's and the payload's locks around these calls, so
 * a request arriving, or the instance taking the queued batch, during a sleep waits for its end; the next batch,
 * formed while the instance runs the one it took, starts up to two sleeps late (a recycled payload looks like the
 * same one until a request joins it). The grace keeps short waits (a burst of arrivals) free of it.
 *
 * After each sleep, no pass sleeps for SPIN_LISTEN_NS. Without that window the batcher held the payload's lock
 * nearly all the time: it takes the lock back within microseconds of each sleep, and the mutex is not fair, so the
 * instance thread trying to take the queued batch (InstanceQueue::Dequeue locks it) starved, holding the rate
 * limiter's queue lock meanwhile. With RATE_LIMIT=on (the CPU default) the instance comes for the batch when the
 * tokenizer frees the cores, mostly during such sleeps: queries at 128 clients ran at 17 texts/s, the encoder one
 * run a second with 60-120 requests queued and the CPU idle, against 250 texts/s with the window (and 230 with no
 * pacing at all; bench/TUNING.md, 2026-11-27).
 *
 * The few Triton C API declarations this needs are written out here (tritonbackend.h / tritonserver.h, API 1.19):
 * the library is built with nothing but a C compiler, and its symbols resolve against the running tritonserver.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

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
/* Attention's memory grows with a run's rows x width^2 (issue 71: one 8,192-token text took bge-m3's encoder to
 * 11 GiB): a batch of several requests holds at most budget x ATTENTION_WIDTH of it, the attention of the budget in
 * texts of this width. Only texts wider than it are held apart by it (bge-m3: one text of over 5,792 tokens a run).
 * The same rule as the tokenizer's groups (tokenizer/1/grouping.py, fits). */
#define ATTENTION_WIDTH 4096
#ifndef SPIN_GRACE_NS
#define SPIN_GRACE_NS 2000000L /* fruitless passes over one queued batch for this long: Init starts to sleep */
#endif
#ifndef SPIN_SLEEP_NS
#define SPIN_SLEEP_NS 100000L
#endif
#ifndef SPIN_LISTEN_NS
#define SPIN_LISTEN_NS 100000L /* after each sleep, this long without one: the lock can change hands */
#endif

typedef struct Batcher Batcher;

typedef struct {
  Batcher* batcher;
  uint64_t rows;  /* of the requests included so far */
  uint64_t width; /* the widest of them */
  bool empty;
  void** payload; /* the payload's user-pointer slot this state was created for */
  bool asked;     /* IncludeRequest was called with it */
  bool took;      /* IncludeRequest included a request in it */
} Batch;

/* One per model; r24.07 runs one batcher thread per dynamically batched model (backend_model.cc), so the calls
 * below come one at a time. */
struct Batcher {
  uint64_t budget;      /* max_batch_tokens of the model's config */
  Batch* open;          /* the state initialized last, while not finalized */
  Batch last_finalized; /* what it left for a pass that continues its payload */
  bool spinning;        /* the last passes over the same payload included nothing... */
  int64_t spin_since;   /* ...since then (CLOCK_MONOTONIC, ns) */
  int64_t listen_until; /* no sleep before then: the window for a thread waiting on the payload's lock */
  bool timer_slack_set; /* on the batcher thread, which makes every call here */
};

static int64_t
now_ns(void)
{
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (int64_t)now.tv_sec * 1000000000L + now.tv_nsec;
}

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

/* Called from Init: throttles the batcher thread's busy-wait over a batch that cannot grow (see above). */
static void
pace(Batcher* owner, void** userp)
{
  if (owner->last_finalized.payload != userp || owner->last_finalized.took) {
    owner->spinning = false;
    return;
  }
  int64_t now = now_ns();
  if (!owner->spinning) {
    owner->spinning = true;
    owner->spin_since = now;
    return;
  }
  if (now - owner->spin_since < SPIN_GRACE_NS || now < owner->listen_until) {
    return;
  }
  if (!owner->timer_slack_set) { /* sleeps that end on time: the default slack adds up to 50 us to each */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    owner->timer_slack_set = true;
  }
  struct timespec pause = {0, SPIN_SLEEP_NS};
  nanosleep(&pause, NULL);
  owner->listen_until = now_ns() + SPIN_LISTEN_NS;
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
  pace(owner, userp);
  if (owner->open != NULL) { /* its payload went to the instance while growing: Triton drops it without Fini */
    free(owner->open);
  }
  Batch* batch = calloc(1, sizeof(Batch));
  batch->batcher = owner;
  batch->empty = true;
  batch->payload = userp;
  if (owner->last_finalized.asked && owner->last_finalized.payload == userp) { /* a new pass, same queued payload */
    batch->rows = owner->last_finalized.rows;
    batch->width = owner->last_finalized.width;
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
    TRITONSERVER_Error* error = TRITONBACKEND_RequestInput(request, "input_ids", &input);
  if (error == NULL) {
    error = TRITONBACKEND_InputProperties(input, NULL, NULL, &shape, &dims, NULL, NULL);
  }
  if (error != NULL) { /* cannot size it: let Triton's own checks answer it, alone */
    TRITONSERVER_ErrorDelete(error);
    *should_include = batch->empty;
    batch->took |= batch->empty;
    batch->empty = false;
    return NULL;
  }
  /* [rows, width]: the tokenizer's and ensemble_bls's requests; any other rank counts as rows of one token each */
  uint64_t rows = dims > 0 ? (uint64_t)shape[0] : 1;
  for (uint32_t i = 1; i + 1 < dims; i++) {
    rows *= (uint64_t)shape[i];
  }
  uint64_t width = dims > 1 ? (uint64_t)shape[dims - 1] : 1;
  uint64_t widest = width > batch->width ? width : batch->width;
  uint64_t total = batch->rows + rows;
  *should_include = batch->empty || (total * widest <= batch->batcher->budget &&
                                     total * widest * widest <= batch->batcher->budget * ATTENTION_WIDTH);
  if (*should_include) {
    batch->rows += rows;
    batch->width = widest;
    batch->empty = false;
    batch->took = true;
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
