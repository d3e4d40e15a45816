/*
 * tokenizer.c — byte-level BPE (Sennrich et al. 2016, "Neural Machine
 * Translation of Rare Words with Subword Units"; GPT-2's byte-level form):
 * training, encode, decode and the strata-bpe file.
 *
 * Tokens 0..255 are the bytes; merge r of (left, right) makes token 256 + r.
 * There is no pre-tokenization: the corpus is one sequence of symbols.
 *
 * Training is incremental, not a pass over the text per merge: the sequence
 * is a doubly linked list over byte positions, a hash map holds every
 * adjacent pair's count and a chain of positions where it was formed, and a
 * lazy max-heap picks the most frequent pair. Merging a pair touches only its
 * occurrences and their neighbours, so the total work is O(n log n) whatever
 * the vocabulary. Stale heap entries and stale positions are skipped when
 * they surface (their count or their symbols no longer match).
 *
 * Encode replays training exactly: a min-heap of (rank, position) pops the
 * lowest-rank pair, leftmost first. A merge of rank r only creates pairs that
 * contain token 256 + r, and those have ranks above r, so pops come in rank
 * order — the same result as applying each merge to the whole text in turn.
 */
#include "strata.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define BYTE_TOKENS 256
#define MAX_VOCAB (1 << 20)
/* A loaded file could describe tokens that double in length with every
 * merge; the byte table of all tokens is capped so such a file fails. */
#define MAX_TOKEN_BYTES ((size_t)1 << 28)
#define MAX_FILE_BYTES ((size_t)64 << 20)
#define EMPTY_KEY UINT64_MAX

struct st_tokenizer {
  int vocab; /* 256 + n_merges */
  int n_merges;
  int32_t *merges; /* (n_merges, 2): merge r makes token 256 + r */
  size_t *offset;  /* (vocab + 1): token t is bytes[offset[t], offset[t+1]) */
  uint8_t *bytes;
  uint64_t *rank_keys; /* (rank_cap): open addressing, pair key -> rank */
  int32_t *ranks;
  size_t rank_cap; /* a power of two */
};

static uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
}

/* murmur3's finaliser: spreads the two ids over all bits. */
static size_t hash_key(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  return (size_t)key;
}

/* Grows *buf (malloc'd) to hold at least `need` elements. Training scratch
 * grows with the pairs it discovers, so it cannot be sized up front. */
static int grow(void **buf, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t next = *cap ? *cap : 1024;
  while (next < need) next *= 2;
  void *p = realloc(*buf, next * elem);
  if (!p) return ST_ENOMEM;
  *buf = p;
  *cap = next;
  return 0;
}

/* ------------------------------------------------------------ tokenizer */

void st_tokenizer_destroy(st_tokenizer *tok) {
  if (!tok) return;
  free(tok->merges);
  free(tok->offset);
  st_free(tok->bytes);
  free(tok->rank_keys);
  free(tok->ranks);
  free(tok);
}

int st_tokenizer_vocab(const st_tokenizer *tok) { return tok->vocab; }

void st_tokenizer_merge(const st_tokenizer *tok, int r, int32_t *left,
                        int32_t *right) {
  *left = tok->merges[2 * r];
  *right = tok->merges[2 * r + 1];
}

uint32_t st_tokenizer_crc(const st_tokenizer *tok) {
  int32_t v = tok->vocab;
  uint32_t crc = (uint32_t)crc32(0, (const Bytef *)&v, sizeof v);
  size_t bytes = (size_t)(tok->vocab - 256) * 2 * sizeof *tok->merges;
  /* (zlib answers a NULL buffer with 0: the byte tokenizer has no merges) */
  return bytes ? (uint32_t)crc32_z(crc, (const Bytef *)tok->merges, bytes)
               : crc;
}

int st_tokenizer_check(const st_tokenizer *tok, const st_config *cfg,
                       const char *path, uint32_t had, st_error *err) {
  uint32_t now = st_tokenizer_crc(tok);
  if (had == now) return 0;
  return st_error_set(err, ST_ECONFIG,
                      "%s: trained with another tokenizer (CRC-32 %08x), the "
                      "config's data.tokenizer (%s, %s) has %08x: its token "
                      "ids would name other text",
                      path, (unsigned)had, cfg->data.tokenizer,
                      st_config_set_at(cfg, "data.tokenizer"), (unsigned)now);
}

static int32_t rank_of(const st_tokenizer *tok, int32_t left, int32_t right) {
  uint64_t key = pair_key(left, right);
  size_t mask = tok->rank_cap - 1;
  for (size_t i = hash_key(key) & mask;; i = (i + 1) & mask) {
    if (tok->rank_keys[i] == key) return tok->ranks[i];
    if (tok->rank_keys[i] == EMPTY_KEY) return -1;
  }
}

/* Checks the merges and builds the rank map and the byte table. `where`
 * (a file name or "training") starts every message; merge r was read from
 * line first_line + r of that file (first_line 0: not from a file). */
static int tokenizer_finish(st_tokenizer *tok, const char *where,
                            int first_line, st_error *err) {
  int n = tok->n_merges;
  tok->rank_cap = 16;
  while (tok->rank_cap < 2 * (size_t)n + 2) tok->rank_cap *= 2;
  tok->rank_keys = malloc(tok->rank_cap * sizeof *tok->rank_keys);
  tok->ranks = malloc(tok->rank_cap * sizeof *tok->ranks);
  tok->offset = malloc(((size_t)tok->vocab + 1) * sizeof *tok->offset);
  if (!tok->rank_keys || !tok->ranks || !tok->offset)
    return st_error_set(err, ST_ENOMEM, "%s: out of memory", where);
  memset(tok->rank_keys, 0xff, tok->rank_cap * sizeof *tok->rank_keys);

  size_t total = BYTE_TOKENS;
  for (int t = 0; t <= BYTE_TOKENS; t++) tok->offset[t] = (size_t)t;
  size_t mask = tok->rank_cap - 1;
  for (int r = 0; r < n; r++) {
    int32_t left = tok->merges[2 * r], right = tok->merges[2 * r + 1];
    int32_t known = BYTE_TOKENS + r; /* tokens that exist before merge r */
    char at[48] = "";
    if (first_line > 0) snprintf(at, sizeof at, "line %d: ", first_line + r);
    if (left < 0 || left >= known || right < 0 || right >= known)
      return st_error_set(err, ST_EFORMAT,
                          "%s: %smerge %d (%d %d) uses a token not defined "
                          "before it (ids must be below %d)",
                          where, at, r, left, right, known);
    uint64_t key = pair_key(left, right);
    size_t i = hash_key(key) & mask;
    while (tok->rank_keys[i] != EMPTY_KEY && tok->rank_keys[i] != key)
      i = (i + 1) & mask;
    if (tok->rank_keys[i] == key)
      return st_error_set(err, ST_EFORMAT,
                          "%s: %smerge %d (%d %d) repeats merge %d", where, at,
                          r, left, right, tok->ranks[i]);
    tok->rank_keys[i] = key;
    tok->ranks[i] = r;
    total += (tok->offset[left + 1] - tok->offset[left]) +
             (tok->offset[right + 1] - tok->offset[right]);
    if (total > MAX_TOKEN_BYTES)
      return st_error_set(err, ST_EFORMAT,
                          "%s: %sthe tokens up to merge %d spell more than "
                          "%zu bytes in all; not a tokenizer strata trained",
                          where, at, r, MAX_TOKEN_BYTES);
    tok->offset[BYTE_TOKENS + r + 1] = total;
  }
  tok->bytes = st_alloc(total);
  if (!tok->bytes)
    return st_error_set(err, ST_ENOMEM, "%s: out of memory", where);
  for (int t = 0; t < BYTE_TOKENS; t++) tok->bytes[t] = (uint8_t)t;
  for (int r = 0; r < n; r++) {
    int32_t left = tok->merges[2 * r], right = tok->merges[2 * r + 1];
    size_t ll = tok->offset[left + 1] - tok->offset[left];
    size_t rl = tok->offset[right + 1] - tok->offset[right];
    uint8_t *dst = tok->bytes + tok->offset[BYTE_TOKENS + r];
    memcpy(dst, tok->bytes + tok->offset[left], ll);
    memcpy(dst + ll, tok->bytes + tok->offset[right], rl);
  }
  return 0;
}

/* A tokenizer with room for n merges, not yet finished. */
static int tokenizer_new(st_tokenizer **out, int n_merges, st_error *err) {
  st_tokenizer *tok = calloc(1, sizeof *tok);
  if (tok)
    tok->merges = malloc(((size_t)n_merges + 1) * 2 * sizeof *tok->merges);
  if (!tok || !tok->merges) {
    st_tokenizer_destroy(tok);
    return st_error_set(err, ST_ENOMEM, "tokenizer: out of memory");
  }
  tok->n_merges = n_merges;
  tok->vocab = BYTE_TOKENS + n_merges;
  *out = tok;
  return 0;
}

size_t st_tokenizer_bytes(const st_tokenizer *tok) {
  return st_alloc_counted(tok->offset[tok->vocab]); /* tokenizer_finish's */
}

int st_tokenizer_create_bytes(st_tokenizer **out, st_error *err) {
  *out = NULL;
  st_tokenizer *tok = NULL;
  int rc = tokenizer_new(&tok, 0, err);
  if (rc) return rc;
  rc = tokenizer_finish(tok, "byte tokenizer", 0, err);
  if (rc) {
    st_tokenizer_destroy(tok);
    return rc;
  }
  *out = tok;
  return 0;
}

/* ------------------------------------------------------------- training */

typedef struct pair_rec {
  int32_t left, right;
  int64_t count;
  int32_t head;  /* newest entry of this pair's position chain, or -1 */
  int32_t dirty; /* count changed since the pair was last pushed */
} pair_rec;

typedef struct heap_entry {
  int64_t count; /* the pair's count when pushed */
  int32_t left, right, id;
} heap_entry;

typedef struct trainer {
  int32_t *tok, *prev, *next; /* (n): symbol at a position; -1 = absorbed */
  pair_rec *pairs;
  size_t n_pairs, pairs_cap;
  uint64_t *keys; /* (map_cap): pair key, EMPTY_KEY for a free slot */
  int32_t *ids;   /* (map_cap): index into pairs */
  size_t map_cap, map_used;
  int32_t *chain_pos, *chain_next; /* position chains, one pool */
  size_t n_chain, chain_cap, chain_next_cap;
  int32_t *dirty;
  size_t n_dirty, dirty_cap;
  heap_entry *heap;
  size_t n_heap, heap_cap;
  int32_t *scratch; /* positions of the pair being merged */
  size_t scratch_cap;
} trainer;

static int map_rehash(trainer *t, size_t cap) {
  uint64_t *keys = malloc(cap * sizeof *keys);
  int32_t *ids = malloc(cap * sizeof *ids);
  if (!keys || !ids) {
    free(keys);
    free(ids);
    return ST_ENOMEM;
  }
  memset(keys, 0xff, cap * sizeof *keys);
  for (size_t i = 0; i < t->map_cap; i++) {
    if (t->keys[i] == EMPTY_KEY) continue;
    size_t j = hash_key(t->keys[i]) & (cap - 1);
    while (keys[j] != EMPTY_KEY) j = (j + 1) & (cap - 1);
    keys[j] = t->keys[i];
    ids[j] = t->ids[i];
  }
  free(t->keys);
  free(t->ids);
  t->keys = keys;
  t->ids = ids;
  t->map_cap = cap;
  return 0;
}

/* Adds delta to the count of (left, right), creating the pair if new; a
 * positive delta also records `pos` as a place where the pair starts. */
static int pair_add(trainer *t, int32_t left, int32_t right, int64_t delta,
                    int32_t pos) {
  if (2 * (t->map_used + 1) > t->map_cap && map_rehash(t, 2 * t->map_cap))
    return ST_ENOMEM;
  uint64_t key = pair_key(left, right);
  size_t mask = t->map_cap - 1, i = hash_key(key) & mask;
  while (t->keys[i] != EMPTY_KEY && t->keys[i] != key) i = (i + 1) & mask;
  if (t->keys[i] == EMPTY_KEY) {
    if (grow((void **)&t->pairs, &t->pairs_cap, t->n_pairs + 1,
             sizeof *t->pairs))
      return ST_ENOMEM;
    t->keys[i] = key;
    t->ids[i] = (int32_t)t->n_pairs;
    t->pairs[t->n_pairs] = (pair_rec){left, right, 0, -1, 0};
    t->n_pairs++;
    t->map_used++;
  }
  pair_rec *p = &t->pairs[t->ids[i]];
  p->count += delta;
  if (delta > 0) {
    size_t c = t->n_chain;
    if (grow((void **)&t->chain_pos, &t->chain_cap, c + 1,
             sizeof *t->chain_pos) ||
        grow((void **)&t->chain_next, &t->chain_next_cap, c + 1,
             sizeof *t->chain_next))
      return ST_ENOMEM;
    t->chain_pos[c] = pos;
    t->chain_next[c] = p->head;
    p->head = (int32_t)c;
    t->n_chain++;
  }
  if (!p->dirty) {
    if (grow((void **)&t->dirty, &t->dirty_cap, t->n_dirty + 1,
             sizeof *t->dirty))
      return ST_ENOMEM;
    p->dirty = 1;
    t->dirty[t->n_dirty++] = t->ids[i];
  }
  return 0;
}

/* Heap order: higher count first, then lower left, then lower right. */
static int heap_before(const heap_entry *a, const heap_entry *b) {
  if (a->count != b->count) return a->count > b->count;
  if (a->left != b->left) return a->left < b->left;
  return a->right < b->right;
}

static int heap_push(trainer *t, heap_entry e) {
  if (grow((void **)&t->heap, &t->heap_cap, t->n_heap + 1, sizeof *t->heap))
    return ST_ENOMEM;
  size_t i = t->n_heap++;
  while (i > 0) {
    size_t up = (i - 1) / 2;
    if (!heap_before(&e, &t->heap[up])) break;
    t->heap[i] = t->heap[up];
    i = up;
  }
  t->heap[i] = e;
  return 0;
}

static heap_entry heap_pop(trainer *t) {
  heap_entry top = t->heap[0], last = t->heap[--t->n_heap];
  size_t i = 0, n = t->n_heap;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= n) break;
    if (c + 1 < n && heap_before(&t->heap[c + 1], &t->heap[c])) c++;
    if (!heap_before(&t->heap[c], &last)) break;
    t->heap[i] = t->heap[c];
    i = c;
  }
  if (n) t->heap[i] = last;
  return top;
}

/* Pushes every pair whose count changed, once, with its current count. */
static int push_dirty(trainer *t) {
  for (size_t i = 0; i < t->n_dirty; i++) {
    pair_rec *p = &t->pairs[t->dirty[i]];
    p->dirty = 0;
    if (p->count >= 2 &&
        heap_push(t, (heap_entry){p->count, p->left, p->right, t->dirty[i]}))
      return ST_ENOMEM;
  }
  t->n_dirty = 0;
  return 0;
}

static int cmp_int32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Replaces every occurrence of pair `id` by token m, leftmost first, and
 * moves the neighbouring pairs' counts. */
static int merge_pair(trainer *t, int32_t id, int32_t m) {
  int32_t a = t->pairs[id].left, b = t->pairs[id].right;
  size_t k = 0;
  for (int32_t c = t->pairs[id].head; c >= 0; c = t->chain_next[c]) {
    if (grow((void **)&t->scratch, &t->scratch_cap, k + 1, sizeof *t->scratch))
      return ST_ENOMEM;
    t->scratch[k++] = t->chain_pos[c];
  }
  t->pairs[id].head = -1;
  /* Leftmost first matters for overlaps: "aaa" merges (a,a) at 0, not 1. */
  qsort(t->scratch, k, sizeof *t->scratch, cmp_int32);
  int32_t *tok = t->tok, *prev = t->prev, *next = t->next;
  for (size_t j = 0; j < k; j++) {
    int32_t p = t->scratch[j], q = next[p];
    if (tok[p] != a || q < 0 || tok[q] != b)
      continue; /* stale: this occurrence was consumed by an earlier one */
    int32_t l = prev[p], r = next[q];
    int rc = 0;
    if (l >= 0)
      rc |= pair_add(t, tok[l], a, -1, 0) | pair_add(t, tok[l], m, 1, l);
    if (r >= 0)
      rc |= pair_add(t, b, tok[r], -1, 0) | pair_add(t, m, tok[r], 1, p);
    rc |= pair_add(t, a, b, -1, 0);
    if (rc) return ST_ENOMEM;
    tok[p] = m;
    tok[q] = -1;
    next[p] = r;
    if (r >= 0) prev[r] = p;
  }
  return 0;
}

static void trainer_free(trainer *t) {
  st_free(t->tok);
  st_free(t->prev);
  st_free(t->next);
  free(t->pairs);
  free(t->keys);
  free(t->ids);
  free(t->chain_pos);
  free(t->chain_next);
  free(t->dirty);
  free(t->heap);
  free(t->scratch);
}

int st_bpe_train(st_tokenizer **out, const uint8_t *text, size_t n, int vocab,
                 st_error *err) {
  *out = NULL;
  if (vocab < BYTE_TOKENS || vocab > MAX_VOCAB)
    return st_error_set(err, ST_EARG,
                        "BPE vocabulary %d is outside [%d, %d] (256 byte "
                        "tokens plus the merges)",
                        vocab, BYTE_TOKENS, MAX_VOCAB);
  /* the pairs' chains of places hold int32 indices: n - 1 places at
   * first and at most two new ones a merged place, so fewer than 3n */
  if (n > (size_t)INT32_MAX / 3)
    return st_error_set(err, ST_EARG,
                        "BPE training text of %zu bytes is too long (at most "
                        "%d bytes)",
                        n, INT32_MAX / 3);
  st_tokenizer *tok = NULL;
  int rc = tokenizer_new(&tok, vocab - BYTE_TOKENS, err);
  if (rc) return rc;
  trainer t = {0};
  int n_merges = 0;
  size_t cells = n ? n : 1;
  t.tok = st_alloc(cells * sizeof *t.tok);
  t.prev = st_alloc(cells * sizeof *t.prev);
  t.next = st_alloc(cells * sizeof *t.next);
  rc = (!t.tok || !t.prev || !t.next) ? ST_ENOMEM : map_rehash(&t, 1 << 16);
  for (size_t i = 0; !rc && i < n; i++) {
    t.tok[i] = text[i];
    t.prev[i] = (int32_t)i - 1;
    t.next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    if (i + 1 < n) rc = pair_add(&t, text[i], text[i + 1], 1, (int32_t)i);
  }
  if (!rc) rc = push_dirty(&t);
  while (!rc && n_merges < tok->n_merges) {
    /* Skip entries whose count has moved on since they were pushed. */
    int found = 0;
    heap_entry best = {0};
    while (t.n_heap && !found) {
      best = heap_pop(&t);
      found = t.pairs[best.id].count == best.count && best.count >= 2;
    }
    if (!found)
      break; /* no pair occurs twice: more merges would not compress */
    rc = merge_pair(&t, best.id, BYTE_TOKENS + n_merges);
    if (!rc) rc = push_dirty(&t);
    tok->merges[2 * n_merges] = best.left;
    tok->merges[2 * n_merges + 1] = best.right;
    n_merges++;
  }
  trainer_free(&t);
  if (rc) {
    st_tokenizer_destroy(tok);
    return st_error_set(err, rc, "BPE training: out of memory (%zu bytes)", n);
  }
  tok->n_merges = n_merges;
  tok->vocab = BYTE_TOKENS + n_merges;
  rc = tokenizer_finish(tok, "BPE training", 0, err);
  if (rc) {
    st_tokenizer_destroy(tok);
    return rc;
  }
  *out = tok;
  return 0;
}

/* ------------------------------------------------------ encode / decode */

static void minheap_push(uint64_t *heap, size_t *n, uint64_t v) {
  size_t i = (*n)++;
  while (i > 0 && heap[(i - 1) / 2] > v) {
    heap[i] = heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  heap[i] = v;
}

static uint64_t minheap_pop(uint64_t *heap, size_t *n) {
  uint64_t top = heap[0], last = heap[--*n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= *n) break;
    if (c + 1 < *n && heap[c + 1] < heap[c]) c++;
    if (heap[c] >= last) break;
    heap[i] = heap[c];
    i = c;
  }
  if (*n) heap[i] = last;
  return top;
}

int st_tokenizer_encode(const st_tokenizer *tok, const uint8_t *text, size_t n,
                        int32_t *ids, size_t *n_ids, st_error *err) {
  *n_ids = 0;
  if (tok->n_merges == 0 || n < 2) {
    for (size_t i = 0; i < n; i++) ids[i] = text[i];
    *n_ids = n;
    return 0;
  }
  if (n >= (size_t)INT32_MAX)
    return st_error_set(err, ST_EARG,
                        "encode: text of %zu bytes is too long (at most %d)", n,
                        INT32_MAX - 1);
  /* The symbols live in ids itself; prev/next link the survivors. A heap
   * entry is rank << 32 | position, so the minimum is the lowest rank,
   * leftmost. Each merge pushes at most two entries, and there are fewer
   * merges than bytes, so 3n entries always suffice. */
  int32_t *prev = st_alloc(n * sizeof *prev);
  int32_t *next = st_alloc(n * sizeof *next);
  uint64_t *heap = st_alloc(3 * n * sizeof *heap);
  if (!prev || !next || !heap) {
    st_free(prev);
    st_free(next);
    st_free(heap);
    return st_error_set(err, ST_ENOMEM, "encode: out of memory (%zu bytes)", n);
  }
  size_t n_heap = 0;
  for (size_t i = 0; i < n; i++) {
    ids[i] = text[i];
    prev[i] = (int32_t)i - 1;
    next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
  }
  for (size_t i = 0; i + 1 < n; i++) {
    int32_t r = rank_of(tok, ids[i], ids[i + 1]);
    if (r >= 0) minheap_push(heap, &n_heap, (uint64_t)r << 32 | i);
  }
  while (n_heap) {
    uint64_t e = minheap_pop(heap, &n_heap);
    int32_t r = (int32_t)(e >> 32), p = (int32_t)(e & 0xffffffffu);
    int32_t q = next[p];
    if (ids[p] < 0 || q < 0 || rank_of(tok, ids[p], ids[q]) != r)
      continue; /* stale: a neighbour merged first */
    int32_t m = BYTE_TOKENS + r, l = prev[p], after = next[q];
    ids[p] = m;
    ids[q] = -1;
    next[p] = after;
    if (after >= 0) prev[after] = p;
    int32_t rl = l >= 0 ? rank_of(tok, ids[l], m) : -1;
    if (rl >= 0) minheap_push(heap, &n_heap, (uint64_t)rl << 32 | (uint32_t)l);
    int32_t rr = after >= 0 ? rank_of(tok, m, ids[after]) : -1;
    if (rr >= 0) minheap_push(heap, &n_heap, (uint64_t)rr << 32 | (uint32_t)p);
  }
  size_t k = 0;
  for (int32_t p = 0; p >= 0; p = next[p]) ids[k++] = ids[p];
  *n_ids = k;
  st_free(prev);
  st_free(next);
  st_free(heap);
  return 0;
}

int st_tokenizer_decode(const st_tokenizer *tok, const int32_t *ids,
                        size_t n_ids, uint8_t *out, size_t cap, size_t *n_out,
                        st_error *err) {
  size_t total = 0;
  for (size_t i = 0; i < n_ids; i++) {
    if (ids[i] < 0 || ids[i] >= tok->vocab) {
      *n_out = 0;
      return st_error_set(err, ST_EDATA,
                          "decode: token id %d at position %zu is outside "
                          "the vocabulary [0, %d)",
                          ids[i], i, tok->vocab);
    }
    total += tok->offset[ids[i] + 1] - tok->offset[ids[i]];
  }
  *n_out = total;
  if (!out) return 0;
  if (cap < total)
    return st_error_set(err, ST_EARG,
                        "decode: output of %zu bytes does not fit in %zu",
                        total, cap);
  size_t at = 0;
  for (size_t i = 0; i < n_ids; i++) {
    size_t len = tok->offset[ids[i] + 1] - tok->offset[ids[i]];
    memcpy(out + at, tok->bytes + tok->offset[ids[i]], len);
    at += len;
  }
  return 0;
}

/* ----------------------------------------------------------------- file */

#define BPE_MAGIC "strata-bpe"
#define BPE_VERSION 1

int st_tokenizer_save(const st_tokenizer *tok, const char *path,
                      st_error *err) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  fprintf(f, "%s %d\nvocab %d\n", BPE_MAGIC, BPE_VERSION, tok->vocab);
  for (int r = 0; r < tok->n_merges; r++)
    fprintf(f, "%d %d\n", tok->merges[2 * r], tok->merges[2 * r + 1]);
  /* temp file, fsync, rename, fsync of the folder: as every file strata
   * writes */
  return st_write_stream_atomic(f, &text, &len, path, err);
}

/* Reads one "%d" or "%d %d" line at *at; returns the count of numbers read
 * (0 at the end of the text, -1 for a malformed line). */
static int read_line_ints(const char **at, const char *end, long *v, int want) {
  const char *s = *at;
  if (s >= end) return 0;
  const char *eol = memchr(s, '\n', (size_t)(end - s));
  if (!eol) return -1; /* the last line lost its newline: truncated */
  for (int i = 0; i < want; i++) {
    if (i > 0) {
      if (*s != ' ') return -1;
      s++;
    }
    if (s >= eol || *s < '0' || *s > '9' || eol - s > 24) return -1;
    char *stop;
    errno = 0;
    v[i] = strtol(s, &stop, 10);
    if (errno || stop > eol) return -1;
    s = stop;
  }
  if (s != eol) return -1;
  *at = eol + 1;
  return want;
}

int st_tokenizer_load(st_tokenizer **out, const char *path, st_error *err) {
  *out = NULL;
  /* the most merges at the longest lines take 26 MB: a larger file (a
   * corpus named by mistake) is refused before it is read into memory */
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
      (uint64_t)sb.st_size > MAX_FILE_BYTES)
    return st_error_set(err, ST_EFORMAT,
                        "%s: %lld bytes, more than a strata BPE tokenizer "
                        "takes (%zu); not a file from `strata tokenize train`",
                        path, (long long)sb.st_size, MAX_FILE_BYTES);
  uint8_t *data = NULL;
  size_t n = 0;
  int rc = st_file_read(&data, &n, path, err);
  if (rc) return rc;
  const char *s = (const char *)data, *end = s + n;
  size_t magic_len = strlen(BPE_MAGIC);
  st_tokenizer *tok = NULL;
  long v[2];
  if (n == 0) {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: empty file; not a strata BPE tokenizer", path);
    goto done;
  }
  if (n <= magic_len && memcmp(s, BPE_MAGIC, n) == 0) {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: truncated header (expected \"%s %d\")", path,
                      BPE_MAGIC, BPE_VERSION);
    goto done;
  }
  if (n <= magic_len || memcmp(s, BPE_MAGIC, magic_len) != 0 ||
      s[magic_len] != ' ') {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: not a strata BPE tokenizer (it should start with "
                      "\"%s %d\"; make one with `strata tokenize train`)",
                      path, BPE_MAGIC, BPE_VERSION);
    goto done;
  }
  s += magic_len + 1;
  if (read_line_ints(&s, end, v, 1) != 1) {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: truncated or malformed header (expected \"%s %d\")",
                      path, BPE_MAGIC, BPE_VERSION);
    goto done;
  }
  if (v[0] != BPE_VERSION) {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: strata-bpe version %ld; this strata reads version "
                      "%d (retrain the tokenizer or upgrade strata)",
                      path, v[0], BPE_VERSION);
    goto done;
  }
  if (end - s < 6 || memcmp(s, "vocab ", 6) != 0 ||
      (s += 6, read_line_ints(&s, end, v, 1) != 1) || v[0] < BYTE_TOKENS ||
      v[0] > MAX_VOCAB) {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: line 2 should be \"vocab N\" with N in [%d, %d]",
                      path, BYTE_TOKENS, MAX_VOCAB);
    goto done;
  }
  int n_merges = (int)v[0] - BYTE_TOKENS;
  rc = tokenizer_new(&tok, n_merges, err);
  if (rc) goto done;
  for (int r = 0; r < n_merges; r++) {
    int got = read_line_ints(&s, end, v, 2);
    if (got == 0 || (got < 0 && !memchr(s, '\n', (size_t)(end - s)))) {
      rc = st_error_set(err, ST_EFORMAT,
                        "%s: truncated: vocab %d needs %d merges, found %d",
                        path, tok->vocab, n_merges, r);
      goto done;
    }
    if (got < 0 || v[0] > INT32_MAX || v[1] > INT32_MAX) {
      rc = st_error_set(err, ST_EFORMAT,
                        "%s: line %d: expected \"LEFT RIGHT\" token ids", path,
                        r + 3);
      goto done;
    }
    tok->merges[2 * r] = (int32_t)v[0];
    tok->merges[2 * r + 1] = (int32_t)v[1];
  }
  if (s != end) {
    rc = st_error_set(err, ST_EFORMAT,
                      "%s: line %d: unexpected data after the %d merges of "
                      "vocab %d",
                      path, n_merges + 3, n_merges, tok->vocab);
    goto done;
  }
  rc = tokenizer_finish(tok, path, 3, err);
done:
  st_free(data);
  if (rc) {
    st_tokenizer_destroy(tok);
    return rc;
  }
  *out = tok;
  return 0;
}
