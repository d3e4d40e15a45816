/*
 * test_tokenizer.c — the byte and BPE tokenizers, the strata-bpe file and
 * text datasets. All text is generated here; nothing comes from outside.
 *
 * References: a hand-worked BPE example ("aaabdaaabac", the classic from
 * Gage 1994 / Wikipedia's byte pair encoding article), and a naive trainer
 * and encoder in this file (one full pass over the text per merge, a dense
 * count table) that the incremental ones must match merge for merge and
 * token for token. Everything is integer, so comparisons are exact.
 */
#include "harness.h"
#include "strata.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmp_dir[64];

static const char *tmp_path(const char *name) {
  static char slots[8][320];
  static int next;
  char *p = slots[next++ % 8];
  snprintf(p, sizeof slots[0], "%s/%s", tmp_dir, name);
  return p;
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  fwrite(data, 1, n, f);
  fclose(f);
}

/* xorshift64*: test data only, so a local generator is enough. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint32_t next_u32(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545f4914f6cdd1dULL) >> 32);
}

/* English-like text: words from a small list, spaces, newlines, some runs
 * of one letter (overlapping pairs such as "aaaa"). */
static size_t gen_text(uint8_t *out, size_t n) {
  static const char *words[] = {"the",         "tokenizer", "merges", "pairs",
                                "of",          "bytes",     "strata", "trains",
                                "a",           "model",     "aaaa",   "banana",
                                "mississippi", "zz",        "to",     "and"};
  size_t k = 0;
  while (k < n) {
    const char *w = words[next_u32() % 16];
    for (size_t i = 0; w[i] && k < n; i++) out[k++] = (uint8_t)w[i];
    if (k < n) out[k++] = next_u32() % 9 == 0 ? '\n' : ' ';
  }
  return n;
}

/* ----------------------------------------------------- naive reference */

/* One pass per merge over the whole sequence; counts in a dense V x V table.
 * Returns the number of merges written to merges (pairs). */
static int naive_train(const uint8_t *text, size_t n, int vocab,
                       int32_t *merges) {
  int32_t *seq = malloc((n + 1) * sizeof *seq);
  int64_t *count = malloc((size_t)vocab * vocab * sizeof *count);
  size_t len = n;
  for (size_t i = 0; i < n; i++) seq[i] = text[i];
  int r = 0;
  for (; 256 + r < vocab; r++) {
    memset(count, 0, (size_t)vocab * vocab * sizeof *count);
    for (size_t i = 0; i + 1 < len; i++)
      count[(size_t)seq[i] * vocab + seq[i + 1]]++;
    int64_t best = 0;
    int a = -1, b = -1;
    for (int x = 0; x < 256 + r; x++)
      for (int y = 0; y < 256 + r; y++)
        if (count[(size_t)x * vocab + y] > best) {
          best = count[(size_t)x * vocab + y];
          a = x;
          b = y;
        }
    if (best < 2) break;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
      if (i + 1 < len && seq[i] == a && seq[i + 1] == b) {
        seq[k++] = 256 + r;
        i++;
      } else {
        seq[k++] = seq[i];
      }
    }
    len = k;
    merges[2 * r] = a;
    merges[2 * r + 1] = b;
  }
  free(seq);
  free(count);
  return r;
}

/* Applies each merge in rank order to the whole sequence, leftmost first. */
static size_t naive_encode(const st_tokenizer *tok, const uint8_t *text,
                           size_t n, int32_t *seq) {
  size_t len = n;
  for (size_t i = 0; i < n; i++) seq[i] = text[i];
  for (int r = 0; r + 256 < st_tokenizer_vocab(tok); r++) {
    int32_t a, b;
    st_tokenizer_merge(tok, r, &a, &b);
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
      if (i + 1 < len && seq[i] == a && seq[i + 1] == b) {
        seq[k++] = 256 + r;
        i++;
      } else {
        seq[k++] = seq[i];
      }
    }
    len = k;
  }
  return len;
}

/* ---------------------------------------------------------------- tests */

/* Encodes, checks the ids are in range, decodes and compares bytes. */
static int round_trips(const st_tokenizer *tok, const uint8_t *text, size_t n) {
  st_error err = {0};
  int32_t *ids = malloc((n + 1) * sizeof *ids);
  uint8_t *back = malloc(n + 1);
  size_t n_ids = 0, n_back = 0;
  int ok = st_tokenizer_encode(tok, text, n, ids, &n_ids, &err) == 0 &&
           st_tokenizer_decode(tok, ids, n_ids, back, n, &n_back, &err) == 0 &&
           n_back == n && (n == 0 || memcmp(back, text, n) == 0);
  for (size_t i = 0; i < n_ids; i++)
    ok &= ids[i] >= 0 && ids[i] < st_tokenizer_vocab(tok);
  free(ids);
  free(back);
  return ok;
}

static void test_bytes(void) {
  st_error err = {0};
  st_tokenizer *tok = NULL;
  CHECK(st_tokenizer_create_bytes(&tok, &err) == 0, "%s", err.msg);
  CHECK(st_tokenizer_vocab(tok) == 256, "byte vocab %d",
        st_tokenizer_vocab(tok));
  uint8_t all[512];
  for (int i = 0; i < 512; i++) all[i] = (uint8_t)(255 - i % 256);
  int32_t ids[512];
  size_t n_ids = 0;
  st_tokenizer_encode(tok, all, sizeof all, ids, &n_ids, &err);
  int same = n_ids == sizeof all;
  for (size_t i = 0; same && i < n_ids; i++) same = ids[i] == all[i];
  CHECK(same, "byte tokens are the bytes (%zu ids)", n_ids);
  CHECK(round_trips(tok, all, sizeof all), "byte round trip");
  CHECK(round_trips(tok, all, 0), "byte round trip of empty text");
  st_tokenizer_destroy(tok);
}

/* Hand-worked: counts aa 4, ab 2, others 1 -> (a,a)=256. Then "ZabdZabac":
 * (256,a) and (a,b) both 2, the lower left id wins -> (a,b)=257. Then
 * "XdXac" after (256,257)=258 has no pair twice: training stops. */
static void test_classic(void) {
  const char *s = "aaabdaaabac";
  st_error err = {0};
  st_tokenizer *tok = NULL;
  CHECK(st_bpe_train(&tok, (const uint8_t *)s, strlen(s), 300, &err) == 0, "%s",
        err.msg);
  CHECK(st_tokenizer_vocab(tok) == 259,
        "stops when no pair occurs twice: "
        "vocab %d, want 259",
        st_tokenizer_vocab(tok));
  static const int32_t want[3][2] = {{'a', 'a'}, {'a', 'b'}, {256, 257}};
  for (int r = 0; r < 3 && r + 256 < st_tokenizer_vocab(tok); r++) {
    int32_t a, b;
    st_tokenizer_merge(tok, r, &a, &b);
    CHECK(a == want[r][0] && b == want[r][1],
          "merge %d is (%d,%d), want "
          "(%d,%d)",
          r, a, b, want[r][0], want[r][1]);
  }
  int32_t ids[16];
  size_t n_ids = 0;
  st_tokenizer_encode(tok, (const uint8_t *)s, strlen(s), ids, &n_ids, &err);
  static const int32_t want_ids[] = {258, 'd', 258, 'a', 'c'};
  CHECK(n_ids == 5 && memcmp(ids, want_ids, sizeof want_ids) == 0,
        "aaabdaaabac encodes to 258 d 258 a c (%zu ids)", n_ids);
  st_tokenizer_destroy(tok);

  /* Overlap: "aaaaa" has (a,a) four times; leftmost first gives Z Z a. */
  CHECK(st_bpe_train(&tok, (const uint8_t *)"aaaaa", 5, 257, &err) == 0, "%s",
        err.msg);
  st_tokenizer_encode(tok, (const uint8_t *)"aaaaa", 5, ids, &n_ids, &err);
  CHECK(n_ids == 3 && ids[0] == 256 && ids[1] == 256 && ids[2] == 'a',
        "aaaaa encodes leftmost first to 256 256 a (%zu ids)", n_ids);
  st_tokenizer_destroy(tok);

  /* A text whose pairs' places could pass int32 (3n of them at most) is
   * refused before it is read: the length alone is checked here */
  tok = NULL;
  int rc = st_bpe_train(&tok, (const uint8_t *)"ab", (size_t)INT32_MAX / 3 + 1,
                        300, &err);
  CHECK(rc == ST_EARG && !tok && strstr(err.msg, "too long"),
        "a text of %zu bytes: rc %d (%s)", (size_t)INT32_MAX / 3 + 1, rc,
        err.msg);
}

static void test_against_naive(void) {
  enum { N = 30000, VOCAB = 420 };
  uint8_t *text = malloc(N);
  gen_text(text, N);
  int32_t *want = malloc(2 * VOCAB * sizeof *want);
  int n_want = naive_train(text, N, VOCAB, want);
  st_error err = {0};
  st_tokenizer *tok = NULL;
  CHECK(st_bpe_train(&tok, text, N, VOCAB, &err) == 0, "%s", err.msg);
  CHECK(st_tokenizer_vocab(tok) == 256 + n_want, "vocab %d, naive %d",
        st_tokenizer_vocab(tok), 256 + n_want);
  int first_diff = -1;
  for (int r = 0; r < n_want && r + 256 < st_tokenizer_vocab(tok); r++) {
    int32_t a, b;
    st_tokenizer_merge(tok, r, &a, &b);
    if (first_diff < 0 && (a != want[2 * r] || b != want[2 * r + 1]))
      first_diff = r;
  }
  CHECK(first_diff < 0, "merge %d differs from the naive trainer", first_diff);
  CHECK(n_want > 100, "the corpus gives enough merges to test (%d)", n_want);

  /* Encode a fresh text (other words order, random bytes mixed in). */
  uint8_t *other = malloc(N);
  gen_text(other, N);
  for (int i = 0; i < N; i += 97) other[i] = (uint8_t)next_u32();
  int32_t *fast = malloc(N * sizeof *fast), *slow = malloc(N * sizeof *slow);
  size_t n_fast = 0, n_slow = naive_encode(tok, other, N, slow);
  st_tokenizer_encode(tok, other, N, fast, &n_fast, &err);
  CHECK(n_fast == n_slow && memcmp(fast, slow, n_fast * sizeof *fast) == 0,
        "encode matches the naive encoder (%zu vs %zu ids)", n_fast, n_slow);
  /* On the training text itself encode ends where training ended. */
  n_slow = naive_encode(tok, text, N, slow);
  st_tokenizer_encode(tok, text, N, fast, &n_fast, &err);
  CHECK(n_fast == n_slow && memcmp(fast, slow, n_fast * sizeof *fast) == 0,
        "encode of the corpus matches the naive encoder");

  /* Determinism: same text, same merges. */
  st_tokenizer *again = NULL;
  st_bpe_train(&again, text, N, VOCAB, &err);
  int same = again && st_tokenizer_vocab(again) == st_tokenizer_vocab(tok);
  for (int r = 0; same && r + 256 < st_tokenizer_vocab(tok); r++) {
    int32_t a, b, c, d;
    st_tokenizer_merge(tok, r, &a, &b);
    st_tokenizer_merge(again, r, &c, &d);
    same = a == c && b == d;
  }
  CHECK(same, "training twice gives identical merges");
  st_tokenizer_destroy(again);

  /* Round trips on random bytes: NUL, invalid UTF-8, lone continuations. */
  uint8_t *noise = malloc(N);
  for (int i = 0; i < N; i++) noise[i] = (uint8_t)next_u32();
  static const uint8_t bad_utf8[] = {0x00, 0xff, 0xc0, 0x80, 0xed, 0xa0,
                                     0x80, 0xf8, 0x00, 0x00, 'a',  0xfe};
  memcpy(noise + 100, bad_utf8, sizeof bad_utf8);
  CHECK(round_trips(tok, noise, N), "round trip of random bytes");
  CHECK(round_trips(tok, bad_utf8, sizeof bad_utf8),
        "round trip of invalid UTF-8 with NULs");
  CHECK(round_trips(tok, other, N), "round trip of text");
  CHECK(round_trips(tok, text, 1), "round trip of one byte");

  /* Decode errors: a token outside the vocabulary, an output too small. */
  int32_t ids[2] = {'a', st_tokenizer_vocab(tok)};
  uint8_t out[8];
  size_t n_out = 0;
  CHECK(st_tokenizer_decode(tok, ids, 2, out, sizeof out, &n_out, &err) ==
                ST_EDATA &&
            strstr(err.msg, "outside the vocabulary"),
        "decode rejects an unknown id: %s", err.msg);
  ids[1] = 256 + n_want - 1; /* the last merge spells >= 2 bytes */
  CHECK(st_tokenizer_decode(tok, ids, 2, NULL, 0, &n_out, &err) == 0 &&
            n_out >= 3,
        "decode counts bytes without output (%zu)", n_out);
  CHECK(st_tokenizer_decode(tok, ids, 2, out, 2, &n_out, &err) == ST_EARG,
        "decode refuses a short output buffer");

  st_tokenizer_destroy(tok);
  free(text);
  free(want);
  free(other);
  free(fast);
  free(slow);
  free(noise);
}

static size_t count_tokens(const uint8_t *text, size_t n, int vocab) {
  st_error err = {0};
  st_tokenizer *tok = NULL;
  if (st_bpe_train(&tok, text, n, vocab, &err)) return 0;
  int32_t *ids = malloc(n * sizeof *ids);
  size_t n_ids = 0;
  st_tokenizer_encode(tok, text, n, ids, &n_ids, &err);
  free(ids);
  st_tokenizer_destroy(tok);
  return n_ids;
}

static void test_compression(void) {
  enum { N = 20000 };
  uint8_t *text = malloc(N);
  gen_text(text, N);
  size_t t256 = count_tokens(text, N, 256), t300 = count_tokens(text, N, 300),
         t400 = count_tokens(text, N, 400);
  CHECK(t256 == N, "vocab 256 is one token a byte (%zu)", t256);
  CHECK(t300 < t256 && t400 < t300,
        "more merges, fewer tokens: %zu > %zu > %zu", t256, t300, t400);
  free(text);

  st_error err = {0};
  st_tokenizer *tok = NULL;
  CHECK(st_bpe_train(&tok, (const uint8_t *)"ab", 2, 255, &err) == ST_EARG &&
            strstr(err.msg, "255"),
        "vocab below 256 is refused: %s", err.msg);
  CHECK(st_bpe_train(&tok, NULL, 0, 1000, &err) == 0 &&
            st_tokenizer_vocab(tok) == 256,
        "empty text trains no merges");
  st_tokenizer_destroy(tok);
}

static void test_file(void) {
  enum { N = 10000 };
  uint8_t *text = malloc(N);
  gen_text(text, N);
  st_error err = {0};
  st_tokenizer *tok = NULL, *back = NULL;
  st_bpe_train(&tok, text, N, 350, &err);
  const char *path = tmp_path("tok.bpe");
  CHECK(st_tokenizer_save(tok, path, &err) == 0, "%s", err.msg);
  CHECK(st_tokenizer_load(&back, path, &err) == 0, "%s", err.msg);
  int same = back && st_tokenizer_vocab(back) == st_tokenizer_vocab(tok);
  for (int r = 0; same && r + 256 < st_tokenizer_vocab(tok); r++) {
    int32_t a, b, c, d;
    st_tokenizer_merge(tok, r, &a, &b);
    st_tokenizer_merge(back, r, &c, &d);
    same = a == c && b == d;
  }
  CHECK(same, "saved and loaded merges are identical");
  int32_t *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
  size_t nx = 0, ny = 0;
  st_tokenizer_encode(tok, text, N, x, &nx, &err);
  if (back) st_tokenizer_encode(back, text, N, y, &ny, &err);
  CHECK(nx == ny && memcmp(x, y, nx * sizeof *x) == 0,
        "loaded tokenizer encodes the same ids");
  st_tokenizer_destroy(back);

  /* The saved text, to damage in several ways. */
  uint8_t *good = NULL;
  size_t n_good = 0;
  st_file_read(&good, &n_good, path, &err);
  struct {
    const char *name, *expect;
    const char *text; /* NULL: a prefix of the good file */
    size_t cut;
  } cases[] = {
      {"magic.bpe", "not a strata BPE tokenizer", "gpt2-bpe 1\nvocab 257\n", 0},
      {"empty.bpe", "empty", "", 0},
      {"version.bpe", "version 2", "strata-bpe 2\nvocab 256\n", 0},
      {"short.bpe", "truncated", "strata-b", 0},
      {"vocab.bpe", "vocab N", "strata-bpe 1\nvocab 12\n", 0},
      {"future.bpe", "line 4: merge 1 (256 257) uses a token not defined",
       "strata-bpe 1\nvocab 258\n97 97\n256 257\n", 0},
      {"repeat.bpe", "line 4: merge 1 (97 97) repeats merge 0",
       "strata-bpe 1\nvocab 258\n97 97\n97 97\n", 0},
      {"garbage.bpe", "line 4", "strata-bpe 1\nvocab 258\n97 97\nx y\n", 0},
      {"trailing.bpe", "line 4: unexpected data",
       "strata-bpe 1\nvocab 257\n97 97\n1 2\n", 0},
      /* ids past int32 (2^32 + 97 once read as 97), signs and blanks
       * strtol would skip: refused, not read as other merges */
      {"wrap.bpe", "line 3", "strata-bpe 1\nvocab 257\n4294967393 97\n", 0},
      {"sign.bpe", "line 3", "strata-bpe 1\nvocab 257\n+97 97\n", 0},
      {"blank.bpe", "line 3", "strata-bpe 1\nvocab 257\n97  97\n", 0},
      {"cut.bpe", "truncated", NULL, n_good / 2},
      {"cutline.bpe", "truncated", NULL, n_good - 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *p = tmp_path(cases[i].name);
    if (cases[i].text)
      write_file(p, cases[i].text, strlen(cases[i].text));
    else
      write_file(p, good, cases[i].cut);
    back = NULL;
    err.msg[0] = 0;
    int rc = st_tokenizer_load(&back, p, &err);
    CHECK(rc == ST_EFORMAT && back == NULL && strstr(err.msg, p) &&
              strstr(err.msg, cases[i].expect) && !strchr(err.msg, '\n'),
          "%s: rc %d, message '%s' should name the file and say '%s'",
          cases[i].name, rc, err.msg, cases[i].expect);
  }
  /* Merges that double a token each time (0 0, 256 256, 257 257, ...):
   * 60 of them spell 2^61 bytes; refused by the byte table's cap before
   * it is sized (an allocation of that, or past 64 merges a wrapped one) */
  char doubling[1024];
  int at = snprintf(doubling, sizeof doubling, "strata-bpe 1\nvocab %d\n0 0\n",
                    256 + 60);
  for (int r = 1; r < 60; r++)
    at += snprintf(doubling + at, sizeof doubling - (size_t)at, "%d %d\n",
                   255 + r, 255 + r);
  const char *dp = tmp_path("doubling.bpe");
  write_file(dp, doubling, (size_t)at);
  back = NULL;
  int rc = st_tokenizer_load(&back, dp, &err);
  CHECK(rc == ST_EFORMAT && back == NULL && strstr(err.msg, dp) &&
            strstr(err.msg, "line 29: the tokens up to merge 26") &&
            strstr(err.msg, "bytes in all"),
        "doubling merges: rc %d, '%s'", rc, err.msg);
  st_tokenizer_destroy(back);
  /* a file past the largest tokenizer (a corpus given by mistake; sparse
   * here) is refused by its size, not read whole into memory first */
  const char *huge = tmp_path("huge.bpe");
  write_file(huge, "strata-bpe 1\nvocab 256\n", 23);
  CHECK(truncate(huge, ((off_t)64 << 20) + 1) == 0, "sparse %s", huge);
  back = NULL;
  rc = st_tokenizer_load(&back, huge, &err);
  CHECK(rc == ST_EFORMAT && back == NULL && strstr(err.msg, huge) &&
            strstr(err.msg, "67108865 bytes, more than a strata BPE"),
        "a 64 MiB + 1 file: rc %d, '%s'", rc, err.msg);
  unlink(huge);
  CHECK(st_tokenizer_load(&back, tmp_path("missing.bpe"), &err) == ST_EIO &&
            strstr(err.msg, "missing.bpe"),
        "a missing file: %s", err.msg);
  st_free(good);
  free(x);
  free(y);
  free(text);
  st_tokenizer_destroy(tok);
}

static void test_text_dataset(void) {
  enum { N = 5000 };
  uint8_t *text = malloc(N);
  gen_text(text, N);
  const char *path = tmp_path("corpus.txt");
  write_file(path, text, N);
  st_error err = {0};
  st_text_dataset *ds = NULL;
  CHECK(st_text_dataset_load(&ds, path, NULL, 0.1, &err) == 0, "%s", err.msg);
  if (ds) {
    CHECK(ds->vocab == 256 && ds->n_bytes == N && ds->n_tokens == N,
          "byte dataset: vocab %d, %zu tokens", ds->vocab, ds->n_tokens);
    CHECK(ds->n_val == 500 && ds->n_train == 4500,
          "split of 5000 at 0.1: %zu train, %zu val", ds->n_train, ds->n_val);
    int same = ds->train == ds->tokens && ds->val == ds->tokens + 4500;
    for (size_t i = 0; same && i < N; i++) same = ds->tokens[i] == text[i];
    CHECK(same, "train is the start of the file, val the end");
    st_text_dataset_destroy(ds);
  }

  st_tokenizer *tok = NULL;
  st_bpe_train(&tok, text, N, 320, &err);
  int32_t *ids = malloc(N * sizeof *ids);
  size_t n_ids = 0;
  st_tokenizer_encode(tok, text, N, ids, &n_ids, &err);
  ds = NULL;
  CHECK(st_text_dataset_load(&ds, path, tok, 0.25, &err) == 0, "%s", err.msg);
  if (ds) {
    size_t n_val = (size_t)((double)n_ids * 0.25);
    CHECK(ds->vocab == 320 && ds->n_tokens == n_ids && n_ids < N &&
              ds->n_val == n_val && ds->n_train + ds->n_val == n_ids,
          "BPE dataset: %zu tokens (%zu val), want %zu (%zu)", ds->n_tokens,
          ds->n_val, n_ids, n_val);
    CHECK(memcmp(ds->tokens, ids, n_ids * sizeof *ids) == 0 &&
              ds->val[0] == ids[ds->n_train],
          "BPE dataset holds the encoded file, split at n_train");
    st_text_dataset_destroy(ds);
  }
  /* a corpus of 2^31 bytes (sparse: nothing is written) is past what
   * BPE's encoder indexes: refused naming the file, before it is read */
  const char *big = tmp_path("big.txt");
  int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  int sized = fd >= 0 && ftruncate(fd, (off_t)1 << 31) == 0;
  if (fd >= 0) close(fd);
  ds = NULL;
  err.msg[0] = 0;
  CHECK(sized && st_text_dataset_load(&ds, big, tok, 0.1, &err) == ST_EDATA &&
            !ds && strstr(err.msg, big) && strstr(err.msg, "2147483648 bytes"),
        "a 2 GiB corpus under BPE: %s", err.msg);
  unlink(big);
  ds = NULL;
  CHECK(st_text_dataset_load(&ds, path, NULL, 0, &err) == 0 && ds &&
            ds->n_val == 0 && ds->n_train == N,
        "val fraction 0: everything trains");
  st_text_dataset_destroy(ds);

  const char *empty = tmp_path("empty.txt");
  write_file(empty, "", 0);
  ds = NULL;
  CHECK(st_text_dataset_load(&ds, empty, NULL, 0.1, &err) == ST_EDATA &&
            strstr(err.msg, empty) && strstr(err.msg, "empty") && !ds,
        "empty corpus: %s", err.msg);
  const char *tiny = tmp_path("tiny.txt");
  write_file(tiny, "hi", 2);
  CHECK(st_text_dataset_load(&ds, tiny, NULL, 0.1, &err) == ST_EDATA &&
            strstr(err.msg, "too few"),
        "two bytes cannot give a 10%% validation part: %s", err.msg);
  CHECK(st_text_dataset_load(&ds, path, NULL, 1.0, &err) == ST_EARG,
        "val fraction 1 is refused");
  CHECK(st_text_dataset_load(&ds, tmp_path("nope.txt"), NULL, 0.1, &err) ==
                ST_EIO &&
            strstr(err.msg, "nope.txt"),
        "missing corpus: %s", err.msg);
  free(ids);
  free(text);
  st_tokenizer_destroy(tok);
}

/* st_utf8_invalid against the Unicode well-formedness table (Unicode 15,
 * table 3-7): the offset of the first byte of the first ill-formed
 * sequence, or the length when all is well formed. */
static void test_utf8(void) {
  static const struct {
    const char *bytes;
    size_t n, want;
  } cases[] = {
      {"", 0, 0},
      {"plain ascii", 11, 11},
      {"\xC3\xA9t\xC3\xA9", 5, 5}, /* été */
      {"\xE2\x82\xAC", 3, 3},      /* euro sign */
      {"\xF0\x9F\x98\x80", 4, 4},  /* U+1F600 */
      {"\xF4\x8F\xBF\xBF", 4, 4},  /* U+10FFFF, the last */
      {"a\xC0\xAF", 3, 1},         /* overlong '/' */
      {"\xC1\xBF", 2, 0},          /* overlong */
      {"\xE0\x80\xAF", 3, 0},      /* overlong 3-byte */
      {"\xE0\x9F\xBF", 3, 0},      /* overlong U+07FF */
      {"\xE0\xA0\x80", 3, 3},      /* U+0800, the first */
      {"\xED\x9F\xBF", 3, 3},      /* U+D7FF */
      {"\xED\xA0\x80", 3, 0},      /* a surrogate, U+D800 */
      {"\xF0\x8F\xBF\xBF", 4, 0},  /* overlong 4-byte */
      {"\xF4\x90\x80\x80", 4, 0},  /* U+110000 */
      {"\xF5\x80\x80\x80", 4, 0},  /* F5: never valid */
      {"ab\xE2\x82", 4, 2},        /* truncated at the end */
      {"\xE2\x28\xA1", 3, 0},      /* bad continuation */
      {"\x80", 1, 0},              /* a lone continuation */
      {"ok\xFF", 3, 2},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t got = st_utf8_invalid((const uint8_t *)cases[i].bytes, cases[i].n);
    CHECK(got == cases[i].want, "utf8 case %zu: first invalid at %zu, want %zu",
          i, got, cases[i].want);
  }
}

int main(void) {
  test_utf8();
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/strata-tok-XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_bytes();
  test_classic();
  test_against_naive();
  test_compression();
  test_file();
  test_text_dataset();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
  TH_DONE();
}
