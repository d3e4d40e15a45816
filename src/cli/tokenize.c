/*
 * tokenize.c — `strata tokenize`: trains a byte-level BPE tokenizer on a
 * corpus and writes it, or prints the token ids of a file (docs: the
 * strata-bpe format is described in strata.h beside st_tokenizer_save).
 * Errors end as one line "strata: error: ..." and exit status 1; a misused
 * command line prints the usage and exits 2.
 */
#include "cli.h"
#include "strata.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *usage_tokenize =
    "usage: strata tokenize train CORPUS --vocab N --out FILE\n"
    "       strata tokenize encode FILE [--tokenizer TOK]\n"
    "\n"
    "train   learns a byte-level BPE tokenizer on CORPUS (any file: bytes,\n"
    "        not necessarily UTF-8): starting from the 256 byte tokens it\n"
    "        merges the most frequent adjacent pair (ties: lowest ids) until\n"
    "        the vocabulary has N tokens, or no pair occurs twice. Prints\n"
    "        merges/s and the compression (bytes per token) on CORPUS, and\n"
    "        writes FILE (\"strata-bpe 1\", \"vocab N\", one merge a line).\n"
    "encode  prints the token ids of FILE, space-separated, one line; with\n"
    "        no --tokenizer the ids are the bytes (vocab 256).\n"
    "\n"
    "options:\n"
    "  --vocab N         vocabulary size, 256 + the number of merges\n"
    "  --out FILE        where the trained tokenizer goes\n"
    "  --tokenizer TOK   a file written by `strata tokenize train`\n"
    "  --help            this text\n";

typedef struct tokenize_args {
  const char *action, *input, *vocab, *out, *tokenizer;
  int help;
} tokenize_args;

static int parse(int argc, char **argv, tokenize_args *a) {
  const st_cli_option options[] = {{"--vocab", &a->vocab, NULL},
                                   {"--out", &a->out, NULL},
                                   {"--tokenizer", &a->tokenizer, NULL},
                                   {NULL, NULL, NULL}};
  const st_cli_spec spec = {usage_tokenize, options, {&a->action, &a->input},
                            NULL,           NULL,    &a->help};
  return st_cli_parse(argc, argv, &spec);
}

static int train(const tokenize_args *a) {
  if (!a->input)
    return st_cli_usage_error(usage_tokenize, "tokenize train needs a CORPUS%s",
                              "");
  if (!a->vocab)
    return st_cli_usage_error(usage_tokenize,
                              "tokenize train needs --vocab N%s", "");
  if (!a->out)
    return st_cli_usage_error(usage_tokenize,
                              "tokenize train needs --out FILE%s", "");
  st_error folder = {0};
  if (st_cli_out_folder("--out", a->out, &folder)) return st_cli_fail(&folder);
  /* the corpus written over by its tokenizer */
  if (st_cli_same_file(a->input, a->out)) {
    st_error same = {0};
    st_error_set(&same, ST_EARG,
                 "--out %s is the corpus %s: the tokenizer would be written "
                 "over it; give another --out",
                 a->out, a->input);
    return st_cli_fail(&same);
  }
  uint64_t vocab;
  if (!st_cli_whole(a->vocab, 1 << 20, &vocab) || vocab < 256)
    return st_cli_usage_error(
        usage_tokenize,
        "--vocab must be an integer in [256, 1048576], not "
        "'%s'",
        a->vocab);
  st_error err = {0};
  uint8_t *text = NULL;
  size_t n = 0;
  st_tokenizer *tok = NULL;
  int32_t *ids = NULL;
  int status = 1;
  if (st_file_read(&text, &n, a->input, &err)) {
    status = st_cli_fail(&err);
    goto done;
  }
  if (n == 0) {
    st_error_set(&err, ST_EDATA, "%s: the corpus is empty", a->input);
    status = st_cli_fail(&err);
    goto done;
  }
  double t0 = st_now();
  if (st_bpe_train(&tok, text, n, (int)vocab, &err)) {
    st_error named = err; /* which corpus */
    st_error_set(&err, named.code, "%s: %s", a->input, named.msg);
    status = st_cli_fail(&err);
    goto done;
  }
  double seconds = st_now() - t0;
  int merges = st_tokenizer_vocab(tok) - 256;
  ids = st_alloc(n * sizeof *ids);
  size_t n_ids = 0;
  if (!ids) {
    st_error_set(&err, ST_ENOMEM, "%s: out of memory", a->input);
    status = st_cli_fail(&err);
    goto done;
  }
  t0 = st_now();
  if (st_tokenizer_encode(tok, text, n, ids, &n_ids, &err)) {
    status = st_cli_fail(&err);
    goto done;
  }
  double encode_seconds = st_now() - t0;
  if (st_tokenizer_save(tok, a->out, &err)) {
    status = st_cli_fail(&err);
    goto done;
  }
  printf("trained %d merges (vocab %d) on %zu bytes in %.3f s: %.0f "
         "merges/s\n",
         merges, st_tokenizer_vocab(tok), n, seconds,
         seconds > 0 ? merges / seconds : 0.0);
  if (merges < (int)vocab - 256)
    printf("stopped early: no pair occurs twice after %d merges\n", merges);
  printf("compression on %s: %zu bytes -> %zu tokens, %.3f bytes/token "
         "(encoded in %.3f s)\n",
         a->input, n, n_ids, (double)n / (double)n_ids, encode_seconds);
  printf("wrote %s\n", a->out);
  status = 0;
done:
  st_free(ids);
  st_free(text);
  st_tokenizer_destroy(tok);
  return status;
}

static int encode(const tokenize_args *a) {
  if (!a->input)
    return st_cli_usage_error(usage_tokenize, "tokenize encode needs a FILE%s",
                              "");
  if (a->vocab || a->out)
    return st_cli_usage_error(usage_tokenize,
                              "%s is an option of tokenize train",
                              a->vocab ? "--vocab" : "--out");
  st_error err = {0};
  st_tokenizer *tok = NULL;
  uint8_t *text = NULL;
  int32_t *ids = NULL;
  size_t n = 0, n_ids = 0;
  int status = 1;
  int rc = a->tokenizer ? st_tokenizer_load(&tok, a->tokenizer, &err)
                        : st_tokenizer_create_bytes(&tok, &err);
  /* BPE encodes at most INT32_MAX - 1 bytes: a longer FILE is refused by
   * its size, naming it, not read first (as st_text_dataset_load) */
  struct stat sb;
  if (!rc && st_tokenizer_vocab(tok) > 256 && stat(a->input, &sb) == 0 &&
      sb.st_size >= INT32_MAX)
    rc = st_error_set(&err, ST_EDATA,
                      "%s: %lld bytes; a BPE tokenizer encodes at most %d "
                      "bytes at once (split the file)",
                      a->input, (long long)sb.st_size, INT32_MAX - 1);
  if (!rc) rc = st_file_read(&text, &n, a->input, &err);
  if (!rc && n) {
    ids = st_alloc(n * sizeof *ids);
    if (!ids) rc = st_error_set(&err, ST_ENOMEM, "%s: out of memory", a->input);
  }
  if (!rc) rc = st_tokenizer_encode(tok, text, n, ids, &n_ids, &err);
  if (rc) {
    status = st_cli_fail(&err);
    goto done;
  }
  for (size_t i = 0; i < n_ids; i++) printf(i ? " %d" : "%d", ids[i]);
  printf("\n");
  status = 0; /* main() says if the output could not be written */
done:
  st_free(ids);
  st_free(text);
  st_tokenizer_destroy(tok);
  return status;
}

int st_cli_tokenize(int argc, char **argv) {
  tokenize_args a = {0};
  int rc = parse(argc, argv, &a);
  if (rc) return rc;
  if (a.help) {
    fputs(usage_tokenize, stdout);
    return 0;
  }
  if (!a.action)
    return st_cli_usage_error(
        usage_tokenize, "tokenize needs an action: train or encode%s", "");
  if (strcmp(a.action, "train") == 0) {
    if (a.tokenizer)
      return st_cli_usage_error(
          usage_tokenize, "--tokenizer is an option of tokenize encode%s", "");
    return train(&a);
  }
  if (strcmp(a.action, "encode") == 0) return encode(&a);
  return st_cli_usage_error(usage_tokenize,
                            "unknown tokenize action '%s' (train or encode)",
                            a.action);
}
