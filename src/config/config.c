/*
 * config.c — YAML file and --set text -> a typed, validated st_config.
 *
 * Everything about a key (type, field, default, enum values) comes from the
 * table in schema.c; this file only walks YAML and converts text. A value
 * from a file, from --set and a default all go through the same typed
 * conversion (set_value), so they accept and reject exactly the same text.
 *
 * Errors are one line that starts with where the offending text is
 * (file:line:col from libyaml's marks, 1-based, or "--set key=value") and
 * names the full key, because the user has to find and fix it. Each key also
 * remembers where it was last set (st_config_where), so that later checks —
 * st_config_validate here, impossible shapes in model/ — can point back at
 * the line that caused them.
 */
#include "schema.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

/* origin[].line values other than a file line. */
enum { ORIGIN_DEFAULT = 0, ORIGIN_SET = -1 };

/* Where the text being converted came from, for the error prefix. */
typedef struct source {
  const char *file;  /* YAML file (errors get file:line:col), or NULL */
  const char *label; /* used when file is NULL: "--set optimizer.lr=fast" */
} source;

/* A key's full name as messages show it: "model.hidden". */
typedef struct key_text {
  char s[96];
} key_text;

static key_text full_name(const st_config_key *k) {
  key_text t;
  snprintf(t.s, sizeof t.s, "%s.%s", k->section, k->name);
  return t;
}

/* Quotes user text in a message, cut short so one bad value cannot push the
 * rest of the message out of st_error's buffer. */
typedef struct shown_text {
  char s[72];
} shown_text;

static shown_text shown(const char *text) {
  shown_text t;
  size_t n = strlen(text);
  if (n < sizeof t.s)
    memcpy(t.s, text, n + 1);
  else { /* cut at a character's first byte, not inside a UTF-8 one */
    int keep = (int)sizeof t.s - 4;
    while (keep > 0 && ((unsigned char)text[keep] & 0xC0) == 0x80) keep--;
    snprintf(t.s, sizeof t.s, "%.*s...", keep, text);
  }
  return t;
}

/* Fills err with "<where>: <message>"; returns code. */
static int fail(st_error *err, int code, const source *src, yaml_mark_t mark,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int fail(st_error *err, int code, const source *src, yaml_mark_t mark,
                const char *fmt, ...) {
  char msg[sizeof err->msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (src->file)
    return st_error_set(err, code, "%s:%zu:%zu: %s", src->file, mark.line + 1,
                        mark.column + 1, msg);
  return st_error_set(err, code, "%s: %s", src->label, msg);
}

/* libyaml's own error, with its mark (or byte offset for unreadable text). */
static int syntax_error(const yaml_parser_t *parser, const source *src,
                        st_error *err) {
  if (parser->error == YAML_MEMORY_ERROR)
    return st_error_set(err, ST_ENOMEM, "%s: out of memory while parsing YAML",
                        src->file ? src->file : src->label);
  const char *problem = parser->problem ? parser->problem : "unknown error";
  const unsigned char *in = parser->input.string.start;
  const unsigned char *end = parser->input.string.end;
  const int utf8 = in && parser->encoding == YAML_UTF8_ENCODING;
  const size_t bom = utf8 && end - in >= 3 && !memcmp(in, "\xef\xbb\xbf", 3);
  /* A byte that is not text has only a byte offset (a BOM counted in it):
   * its line and column, counted as libyaml's marks count them (characters
   * after a BOM), so the message names a place an editor can go to. */
  if (parser->error == YAML_READER_ERROR && utf8 &&
      parser->problem_offset <= (size_t)(end - in)) {
    yaml_mark_t at = {0};
    for (const unsigned char *p = in + 3 * bom; p < in + parser->problem_offset;
         p++)
      if (*p == '\n' || (*p == '\r' && (p + 1 == end || p[1] != '\n')))
        at.line++, at.column = 0;
      else if ((*p & 0xc0) != 0x80) /* a character's first byte */
        at.column++;
    if (parser->problem_value >= 0)
      return fail(err, ST_ECONFIG, src, at, "YAML syntax error: %s (0x%02x)",
                  problem, (unsigned)parser->problem_value);
    return fail(err, ST_ECONFIG, src, at, "YAML syntax error: %s", problem);
  }
  if (parser->error == YAML_READER_ERROR)
    return st_error_set(
        err, ST_ECONFIG, "%s: YAML syntax error at byte %zu: %s",
        src->file ? src->file : src->label, parser->problem_offset, problem);
  /* libyaml's word for a tab where indentation goes says nothing of tabs.
   * Its mark counts characters from after a byte-order mark, not bytes: an
   * "é" or a BOM before the tab once hid it. */
  const unsigned char *at = NULL;
  if (utf8) {
    in += 3 * bom;
    size_t left = parser->problem_mark.index;
    for (const unsigned char *p = in; p < end && !at; p++)
      if ((*p & 0xc0) != 0x80 && left-- == 0) at = p; /* a character's start */
  }
  if (at && *at == '\t')
    return fail(err, ST_ECONFIG, src, parser->problem_mark,
                "YAML syntax error: a tab; YAML indents with spaces");
  if (parser->context)
    return fail(err, ST_ECONFIG, src, parser->problem_mark,
                "YAML syntax error: %s (%s at %zu:%zu)", problem,
                parser->context, parser->context_mark.line + 1,
                parser->context_mark.column + 1);
  return fail(err, ST_ECONFIG, src, parser->problem_mark,
              "YAML syntax error: %s", problem);
}

/* ---------------------------------------------------------- suggestions */

/* Optimal-string-alignment distance (Levenshtein plus transpositions), so
 * "modle" is one edit from "model". Long strings are simply "far". */
static int edit_distance(const char *a, const char *b) {
  enum { MAXLEN = 48 };
  size_t n = strlen(a), m = strlen(b);
  if (n >= MAXLEN || m >= MAXLEN) return INT_MAX / 2;
  int d[MAXLEN + 1][MAXLEN + 1];
  for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      int cost = a[i - 1] != b[j - 1];
      int best = d[i - 1][j - 1] + cost;
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[n][m];
}

/* How many edits still count as a typo of a word of this length. */
static int typo_budget(const char *word) {
  size_t n = strlen(word);
  return n <= 3 ? 1 : n <= 8 ? 2 : 3;
}

/* The known key closest to section.name, or -1. A key with the same name in
 * another section costs one edit, so "train.lr" suggests "optimizer.lr". */
static int suggest_key(const char *section, const char *name) {
  int best = -1, best_d = typo_budget(name) + 1;
  for (int i = 0; i < st_config_schema_count; i++) {
    const st_config_key *k = &st_config_schema[i];
    int d = edit_distance(name, k->name) + (strcmp(section, k->section) != 0);
    if (d < best_d) best = i, best_d = d;
  }
  return best;
}

/* " (did you mean 'model.hidden'?)" or "". */
static key_text did_you_mean_key(const char *section, const char *name) {
  key_text t = {""};
  int row = suggest_key(section, name);
  if (row >= 0)
    snprintf(t.s, sizeof t.s, " (did you mean '%s.%s'?)",
             st_config_schema[row].section, st_config_schema[row].name);
  return t;
}

static key_text did_you_mean_section(const char *name) {
  key_text t = {""};
  int best_d = typo_budget(name) + 1;
  for (int i = 0; i < st_config_schema_count; i++) {
    const char *s = st_config_schema[i].section;
    int d = edit_distance(name, s);
    if (d < best_d) {
      best_d = d;
      snprintf(t.s, sizeof t.s, " (did you mean '%s'?)", s);
    }
  }
  return t;
}

/* ------------------------------------------------------ typed conversion */

/* A plain empty, "~" or "null" scalar: YAML's null, i.e. "key:" with
 * nothing after it. Quoted '' is an empty string, not null. */
static int is_null(const yaml_node_t *node) {
  if (node->type != YAML_SCALAR_NODE) return 0;
  if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
  const char *s = (const char *)node->data.scalar.value;
  return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
         !strcmp(s, "NULL");
}

static const char *node_kind(const yaml_node_t *node) {
  if (node->type == YAML_SEQUENCE_NODE) return "a list";
  if (node->type == YAML_MAPPING_NODE) return "a mapping";
  return "no value";
}

static const char *expected_text(st_config_type type) {
  switch (type) {
  case ST_CONFIG_INT:
  case ST_CONFIG_INT64:
    return "an integer";
  case ST_CONFIG_UINT64:
    return "a non-negative integer";
  case ST_CONFIG_FLOAT:
    return "a number";
  case ST_CONFIG_BOOL:
    return "true or false (or yes/no, on/off)";
  case ST_CONFIG_STRING:
  case ST_CONFIG_ENUM:
    return "a string";
  case ST_CONFIG_INT_LIST:
    return "a list of integers such as [256, 256]";
  }
  return "?";
}

/* Decimal integer in [lo, hi]. Returns 0, or 1 for "not an integer", 2 for
 * "out of range". strtoll alone would accept leading blanks and "12abc". */
static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  const char *digits = (*s == '+' || *s == '-') ? s + 1 : s;
  if (*digits < '0' || *digits > '9') return 1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (*end) return 1;
  if (errno == ERANGE || v < lo || v > hi) return 2;
  *out = v;
  return 0;
}

static int parse_uint64(const char *s, uint64_t *out) {
  const char *digits = *s == '+' ? s + 1 : s;
  if (*digits < '0' || *digits > '9') return 1; /* strtoull takes "-1" */
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end) return 1;
  if (errno == ERANGE) return 2;
  *out = v;
  return 0;
}

/* Parsed straight to float (not via double) so that printing with enough
 * digits and reading back gives the same bits. Decimal only: strtof would
 * also read "0x10" as 16 and "0x1p-3" as 0.125, which a config should not
 * mean by a learning rate. */
static int parse_float(const char *s, float *out) {
  if (!*s || strspn(s, "+-.0123456789eE") != strlen(s)) return 1;
  char *end;
  errno = 0;
  float v = strtof(s, &end);
  if (*end) return 1;
  if (isnan(v)) return 1;
  if (isinf(v)) return errno == ERANGE ? 2 : 1;
  if (v == 0 && errno == ERANGE) return 2; /* 1e-50: not zero as written */
  *out = v;
  return 0;
}

static int parse_bool(const char *s, int *out) {
  static const char *const yes[] = {"true", "yes", "on"};
  static const char *const no[] = {"false", "no", "off"};
  for (int i = 0; i < 3; i++) {
    if (!strcasecmp(s, yes[i]) || !strcasecmp(s, no[i])) {
      *out = !strcasecmp(s, yes[i]);
      return 0;
    }
  }
  return 1;
}

/* "relu, gelu, gelu_tanh" */
static void list_choices(const char *const *choices, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; choices[i]; i++) {
    int n = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", choices[i]);
    if (n < 0 || (size_t)n >= cap - used) return;
    used += (size_t)n;
  }
}

static int is_choice(const char *const *choices, const char *s) {
  for (int i = 0; choices[i]; i++)
    if (!strcmp(choices[i], s)) return 1;
  return 0;
}

/* An int from a scalar node; key names it in the message ("model.hidden[1]").
 */
static int node_int(const yaml_node_t *node, int64_t lo, int64_t hi,
                    int64_t *out, const char *key, const source *src,
                    st_error *err) {
  if (node->type != YAML_SCALAR_NODE || is_null(node))
    return fail(err, ST_ECONFIG, src, node->start_mark,
                "%s: expected an integer, got %s", key, node_kind(node));
  const char *text = (const char *)node->data.scalar.value;
  int bad = parse_int(text, lo, hi, out);
  if (bad == 1)
    return fail(err, ST_ECONFIG, src, node->start_mark,
                "%s: expected an integer, got '%s'", key, shown(text).s);
  if (bad == 2)
    return fail(err, ST_ECONFIG, src, node->start_mark,
                "%s: %s is out of range [%" PRId64 ", %" PRId64 "]", key,
                shown(text).s, lo, hi);
  return 0;
}

/* A YAML sequence of ints; stored only once every item has converted. */
static int set_list(st_int_list *dst, yaml_document_t *doc, yaml_node_t *node,
                    const char *key, const source *src, st_error *err) {
  if (node->type != YAML_SEQUENCE_NODE) {
    const char *what = node->type == YAML_SCALAR_NODE && !is_null(node)
                           ? (const char *)node->data.scalar.value
                           : NULL;
    if (what)
      return fail(err, ST_ECONFIG, src, node->start_mark,
                  "%s: expected %s, got '%s'", key,
                  expected_text(ST_CONFIG_INT_LIST), shown(what).s);
    return fail(err, ST_ECONFIG, src, node->start_mark,
                "%s: expected %s, got %s", key,
                expected_text(ST_CONFIG_INT_LIST), node_kind(node));
  }
  st_int_list list;
  memset(&list, 0, sizeof list);
  for (yaml_node_item_t *it = node->data.sequence.items.start;
       it < node->data.sequence.items.top; it++) {
    yaml_node_t *item = yaml_document_get_node(doc, *it);
    if (list.n == ST_MAX_LIST)
      return fail(err, ST_ECONFIG, src, item->start_mark,
                  "%s: more than %d items", key, ST_MAX_LIST);
    char item_key[112];
    snprintf(item_key, sizeof item_key, "%s[%d]", key, list.n);
    int64_t v;
    int rc = node_int(item, INT_MIN, INT_MAX, &v, item_key, src, err);
    if (rc) return rc;
    list.v[list.n++] = (int)v;
  }
  *dst = list;
  return 0;
}

/* Converts a scalar's text for key k and stores it at dst. */
static int set_scalar(void *dst, const st_config_key *k,
                      const yaml_node_t *node, const char *key,
                      const source *src, st_error *err) {
  const char *text = (const char *)node->data.scalar.value;
  yaml_mark_t at = node->start_mark;
  int bad = 0;
  switch (k->type) {
  case ST_CONFIG_INT: {
    /* execution.stages also takes a word: every block its own stage */
    if (node->type == YAML_SCALAR_NODE && !strcmp(key, "execution.stages") &&
        !strcmp(text, "per_block")) {
      *(int *)dst = ST_STAGES_PER_BLOCK;
      return 0;
    }
    int64_t v;
    int rc = node_int(node, INT_MIN, INT_MAX, &v, key, src, err);
    if (!rc) *(int *)dst = (int)v;
    return rc;
  }
  case ST_CONFIG_INT64:
    return node_int(node, INT64_MIN, INT64_MAX, (int64_t *)dst, key, src, err);
  case ST_CONFIG_UINT64:
    bad = parse_uint64(text, (uint64_t *)dst);
    break;
  case ST_CONFIG_FLOAT:
    bad = parse_float(text, (float *)dst);
    if (bad == 2)
      return fail(err, ST_ECONFIG, src, at,
                  "%s: %s is out of range for a float", key, shown(text).s);
    break;
  case ST_CONFIG_BOOL:
    bad = parse_bool(text, (int *)dst);
    break;
  case ST_CONFIG_ENUM:
    /* a retired choice: why it went, and what to write instead */
    if (!strcmp(key, "execution.mitigation") && !strcmp(text, "spectrain"))
      return fail(err, ST_ECONFIG, src, at,
                  "%s: 'spectrain' is lwp here: in fine-grained pipelined "
                  "backprop each stage applies a micro-batch's gradient "
                  "right after its backward, so SpecTrain's backward "
                  "predicts 0 updates ahead and its forward lwp's D; write "
                  "lwp",
                  key);
    if (!is_choice(k->choices, text)) {
      char choices[256];
      list_choices(k->choices, choices, sizeof choices);
      return fail(err, ST_ECONFIG, src, at, "%s: '%s' is not one of %s", key,
                  shown(text).s, choices);
    }
    /* fall through - an allowed enum value is stored as a string */
  case ST_CONFIG_STRING:
    if (node->data.scalar.length >= k->size)
      return fail(err, ST_ECONFIG, src, at, "%s: longer than %zu characters",
                  key, k->size - 1);
    memset(dst, 0, k->size); /* whole field, so equal configs compare equal */
    memcpy(dst, text, node->data.scalar.length);
    break;
  case ST_CONFIG_INT_LIST:
    break; /* handled by set_list */
  }
  if (bad == 2)
    return fail(err, ST_ECONFIG, src, at, "%s: %s is out of range", key,
                shown(text).s);
  if (bad)
    return fail(err, ST_ECONFIG, src, at, "%s: expected %s, got '%s'", key,
                expected_text(k->type), shown(text).s);
  return 0;
}

/* Converts node for schema row `row` and stores it in cfg; on error cfg's
 * field is left as it was. */
static int set_value(st_config *cfg, int row, yaml_document_t *doc,
                     yaml_node_t *node, const source *src, st_error *err) {
  const st_config_key *k = &st_config_schema[row];
  void *dst = (char *)cfg + k->offset;
  key_text key = full_name(k);
  if (k->type == ST_CONFIG_INT_LIST)
    return set_list(dst, doc, node, key.s, src, err);
  if (node->type != YAML_SCALAR_NODE || is_null(node))
    return fail(err, ST_ECONFIG, src, node->start_mark,
                "%s: expected %s, got %s", key.s, expected_text(k->type),
                node_kind(node));
  if (strlen((const char *)node->data.scalar.value) != node->data.scalar.length)
    return fail(err, ST_ECONFIG, src, node->start_mark,
                "%s: value contains a NUL character", key.s);
  /* Convert into a copy so a half-written value never reaches cfg. */
  unsigned char tmp[ST_PATH_MAX];
  _Static_assert(sizeof tmp >= sizeof(((st_config *)0)->data.dir),
                 "largest scalar field must fit tmp");
  memcpy(tmp, dst, k->size);
  int rc = set_scalar(tmp, k, node, key.s, src, err);
  if (!rc) memcpy(dst, tmp, k->size);
  return rc;
}

static int check_nesting(const char *text, size_t len, const char *path,
                         st_error *err);

/* Parses `text` as one YAML value (scalar or flow/block sequence) for row:
 * as shallow as a file must be, and one document (a second one would be
 * dropped unread). */
static int set_from_text(st_config *cfg, int row, const char *text,
                         const source *src, st_error *err) {
  yaml_parser_t parser;
  yaml_document_t doc;
  if (check_nesting(text, strlen(text), src->label, err)) return err->code;
  if (!yaml_parser_initialize(&parser))
    return st_error_set(err, ST_ENOMEM, "%s: out of memory", src->label);
  yaml_parser_set_input_string(&parser, (const unsigned char *)text,
                               strlen(text));
  int rc;
  if (!yaml_parser_load(&parser, &doc)) {
    rc = syntax_error(&parser, src, err);
  } else {
    /* a second document first: cfg is untouched on any error */
    yaml_document_t next;
    rc = 0;
    if (!yaml_parser_load(&parser, &next)) {
      rc = syntax_error(&parser, src, err);
    } else {
      if (yaml_document_get_root_node(&next))
        rc = st_error_set(err, ST_ECONFIG,
                          "%s: %s.%s: the value holds a second YAML document "
                          "('---'); give one value",
                          src->label, st_config_schema[row].section,
                          st_config_schema[row].name);
      yaml_document_delete(&next);
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!rc && root)
      rc = set_value(cfg, row, &doc, root, src, err);
    else if (!rc)
      rc = st_error_set(err, ST_ECONFIG, "%s: %s.%s: no value", src->label,
                        st_config_schema[row].section,
                        st_config_schema[row].name);
    yaml_document_delete(&doc);
  }
  yaml_parser_delete(&parser);
  return rc;
}

/* ------------------------------------------------------------ defaults */

void st_config_defaults(st_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  for (int i = 0; i < st_config_schema_count; i++) {
    /* The defaults are our own text, parsed like user text so the table
     * cannot hold a value a user could not write; a failure here is a bug
     * in schema.c (or out of memory), which the config test catches. */
    source src = {NULL, "default"};
    int rc = set_from_text(cfg, i, st_config_schema[i].def, &src, NULL);
    assert(rc == 0 && "a default in schema.c does not parse");
    (void)rc; /* NDEBUG builds */
  }
}

/* ------------------------------------------------------------ file load */

/* Marks of where each key / section was first seen in this file, to report
 * duplicates; line 0 = not seen. */
typedef struct seen {
  struct st_config_origin at[ST_CONFIG_MAX_KEYS];
} seen;

static struct st_config_origin origin_of(yaml_mark_t mark) {
  struct st_config_origin o = {(int)mark.line + 1, (int)mark.column + 1};
  return o;
}

/* The text of a mapping key, which must be a plain name. */
static int key_name(const yaml_node_t *node, const char **name,
                    const source *src, st_error *err) {
  if (node->type != YAML_SCALAR_NODE || is_null(node))
    return fail(err, ST_ECONFIG, src, node->start_mark,
                "expected a key name, got %s", node_kind(node));
  *name = (const char *)node->data.scalar.value;
  if (strlen(*name) != node->data.scalar.length) /* "kind\0x" is not kind */
    return fail(err, ST_ECONFIG, src, node->start_mark,
                "a key name contains a NUL character");
  return 0;
}

static int load_key(st_config *cfg, yaml_document_t *doc,
                    yaml_node_pair_t *pair, const char *section, seen *keys,
                    const source *src, st_error *err) {
  yaml_node_t *knode = yaml_document_get_node(doc, pair->key);
  yaml_node_t *value = yaml_document_get_node(doc, pair->value);
  const char *name = ""; /* initialised: gcc cannot see key_name's rc */
  int rc = key_name(knode, &name, src, err);
  if (rc) return rc;
  int row = st_config_key_find(section, strlen(section), name);
  if (row < 0)
    return fail(err, ST_ECONFIG, src, knode->start_mark,
                "unknown key '%s.%s'%s", section, shown(name).s,
                did_you_mean_key(section, name).s);
  if (keys->at[row].line)
    return fail(err, ST_ECONFIG, src, knode->start_mark,
                "duplicate key '%s.%s' (first at %d:%d)", section, name,
                keys->at[row].line, keys->at[row].col);
  keys->at[row] = origin_of(knode->start_mark);
  rc = set_value(cfg, row, doc, value, src, err);
  /* a value that starts before its key is an alias's (*x): libyaml gives
   * the anchored node, marked where the anchor is, under another key; the
   * key's own place is where this one was set */
  yaml_mark_t at = value->start_mark.index < knode->start_mark.index
                       ? knode->start_mark
                       : value->start_mark;
  if (!rc) cfg->origin[row] = origin_of(at);
  return rc;
}

static int load_section(st_config *cfg, yaml_document_t *doc,
                        yaml_node_pair_t *pair, seen *sections, seen *keys,
                        const source *src, st_error *err) {
  yaml_node_t *knode = yaml_document_get_node(doc, pair->key);
  yaml_node_t *value = yaml_document_get_node(doc, pair->value);
  const char *section = "";
  int rc = key_name(knode, &section, src, err);
  if (rc) return rc;
  int first = st_config_section_find(section);
  if (first < 0)
    return fail(err, ST_ECONFIG, src, knode->start_mark,
                "unknown section '%s'%s", shown(section).s,
                did_you_mean_section(section).s);
  if (sections->at[first].line)
    return fail(err, ST_ECONFIG, src, knode->start_mark,
                "duplicate section '%s' (first at %d:%d)", section,
                sections->at[first].line, sections->at[first].col);
  sections->at[first] = origin_of(knode->start_mark);
  if (is_null(value)) return 0; /* "model:" with every key commented out */
  if (value->type != YAML_MAPPING_NODE)
    return fail(err, ST_ECONFIG, src, value->start_mark,
                "section '%s' must be a mapping of key: value, got %s", section,
                value->type == YAML_SCALAR_NODE ? "a scalar"
                                                : node_kind(value));
  for (yaml_node_pair_t *p = value->data.mapping.pairs.start;
       p < value->data.mapping.pairs.top; p++)
    if ((rc = load_key(cfg, doc, p, section, keys, src, err))) return rc;
  return 0;
}

static int load_document(st_config *cfg, yaml_document_t *doc,
                         const source *src, st_error *err) {
  yaml_node_t *root = yaml_document_get_root_node(doc);
  if (!root || is_null(root)) return 0; /* empty file: all defaults */
  if (root->type != YAML_MAPPING_NODE)
    return fail(err, ST_ECONFIG, src, root->start_mark,
                "expected sections (model:, data:, ...) at the top level, "
                "got %s",
                root->type == YAML_SCALAR_NODE ? "a scalar" : node_kind(root));
  seen sections, keys;
  memset(&sections, 0, sizeof sections);
  memset(&keys, 0, sizeof keys);
  for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
       p < root->data.mapping.pairs.top; p++) {
    int rc = load_section(cfg, doc, p, &sections, &keys, src, err);
    if (rc) return rc;
  }
  return 0;
}

/* One document, applied to cfg; a second document is an error rather than
 * silently ignored. */
static int load_stream(st_config *cfg, yaml_parser_t *parser, const source *src,
                       st_error *err) {
  yaml_document_t doc;
  if (!yaml_parser_load(parser, &doc)) return syntax_error(parser, src, err);
  int rc = load_document(cfg, &doc, src, err);
  yaml_document_delete(&doc);
  if (rc) return rc;
  if (!yaml_parser_load(parser, &doc)) return syntax_error(parser, src, err);
  yaml_node_t *extra = yaml_document_get_root_node(&doc);
  if (extra)
    rc = fail(err, ST_ECONFIG, src, extra->start_mark,
              "expected one YAML document, found a second one");
  yaml_document_delete(&doc);
  return rc;
}

/* What a config may be before libyaml sees it: its parser is quadratic in
 * the nesting depth (100,000 '[' took 47 s) and holds a whole flow list in
 * memory (50 MB of it took 1.7 GB), and a strata config is 3 levels deep
 * and a few KB. */
enum { CONFIG_MAX_BYTES = 16 << 20, CONFIG_MAX_DEPTH = 64 };

/* The whole file, NUL-terminated, at most CONFIG_MAX_BYTES. */
static char *read_config(const char *path, size_t *len, st_error *err) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    st_error_set(err, ST_EIO, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
    fclose(f);
    st_error_set(err, ST_EIO, "%s: cannot open: %s", path, strerror(EISDIR));
    return NULL;
  }
  /* a pipe or a device has no size: read one byte past the limit */
  char *buf = malloc(CONFIG_MAX_BYTES + 2);
  size_t n = buf ? fread(buf, 1, CONFIG_MAX_BYTES + 1, f) : 0;
  int failed = buf && ferror(f) ? errno : 0;
  fclose(f);
  if (!buf) {
    st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  } else if (failed) {
    st_error_set(err, ST_EIO, "%s: cannot read: %s", path, strerror(failed));
  } else if (n > CONFIG_MAX_BYTES) {
    st_error_set(err, ST_ECONFIG,
                 "%s: larger than the %d MiB a config may be (%lld bytes); "
                 "refused before parsing",
                 path, CONFIG_MAX_BYTES >> 20,
                 S_ISREG(st.st_mode) ? (long long)st.st_size : (long long)n);
  } else {
    buf[n] = '\0';
    *len = n;
    return buf;
  }
  free(buf);
  return NULL;
}

/* Refuses text nested deeper than CONFIG_MAX_DEPTH before it is loaded,
 * by libyaml's own events (its scanner knows quotes, comments and block
 * scalars, which a count of brackets had to guess at, and a guess let 200k
 * levels through): loading a deep document whole is quadratic in its depth,
 * so a 16 MiB file could take hours, while the events stop at the first
 * level too many. A syntax error is left to the load, which names it. */
static int check_nesting(const char *text, size_t len, const char *path,
                         st_error *err) {
  yaml_parser_t parser;
  if (!yaml_parser_initialize(&parser))
    return st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
  int depth = 0, rc = 0;
  for (;;) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&parser, &ev)) break;
    yaml_event_type_t type = ev.type;
    yaml_mark_t at = ev.start_mark;
    yaml_event_delete(&ev);
    if (type == YAML_STREAM_END_EVENT) break;
    if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT)
      depth--;
    if ((type == YAML_SEQUENCE_START_EVENT ||
         type == YAML_MAPPING_START_EVENT) &&
        ++depth > CONFIG_MAX_DEPTH) {
      rc = st_error_set(err, ST_ECONFIG,
                        "%s:%zu:%zu: nested deeper than %d levels (a config "
                        "needs 3); refused before parsing",
                        path, at.line + 1, at.column + 1, CONFIG_MAX_DEPTH);
      break;
    }
  }
  yaml_parser_delete(&parser);
  return rc;
}

/* Starts from the defaults; cfg is replaced only if the whole file is
 * valid, so a failed load leaves the caller's config untouched. */
int st_config_load(st_config *cfg, const char *path, st_error *err) {
  st_config next;
  st_config_defaults(&next);
  if (strlen(path) >= sizeof next.path)
    return st_error_set(err, ST_EIO,
                        "%.64s...: cannot open: path longer than "
                        "%d characters",
                        path, ST_PATH_MAX - 1);
  strcpy(next.path, path);
  size_t len = 0;
  char *text = read_config(path, &len, err);
  if (!text) return err->code;
  yaml_parser_t parser;
  int rc = check_nesting(text, len, path, err);
  if (rc) {
  } else if (!yaml_parser_initialize(&parser)) {
    rc = st_error_set(err, ST_ENOMEM, "%s: out of memory", path);
  } else {
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    source src = {path, NULL};
    rc = load_stream(&next, &parser, &src, err);
    yaml_parser_delete(&parser);
  }
  free(text);
  if (!rc) memcpy(cfg, &next, sizeof next);
  return rc;
}

/* ----------------------------------------------------------------- --set */

/* Splits "section.key=value"; row is the key's schema row. */
static int parse_assignment(const char *assignment, int *row,
                            const char **value, st_error *err) {
  const char *eq = strchr(assignment, '=');
  if (!eq)
    return st_error_set(err, ST_ECONFIG, "--set %s: expected section.key=value",
                        assignment);
  const char *start = assignment, *end = eq;
  while (start < end && (*start == ' ' || *start == '\t')) start++;
  while (end > start && (end[-1] == ' ' || end[-1] == '\t')) end--;
  char key[96];
  size_t n = (size_t)(end - start);
  if (n >= sizeof key) n = sizeof key - 1; /* too long to be a key anyway */
  memcpy(key, start, n);
  key[n] = '\0';
  char *dot = strchr(key, '.');
  *row = dot ? st_config_key_find(key, (size_t)(dot - key), dot + 1) : -1;
  if (*row < 0) {
    if (dot) *dot = '\0';
    key_text hint =
        dot ? did_you_mean_key(key, dot + 1) : did_you_mean_key("", key);
    if (dot) *dot = '.';
    return st_error_set(err, ST_ECONFIG, "--set %s: unknown key '%s'%s",
                        assignment, key, hint.s);
  }
  *value = eq + 1;
  return 0;
}

int st_config_set(st_config *cfg, const char *assignment, st_error *err) {
  int row = -1;
  const char *value = "";
  int rc = parse_assignment(assignment, &row, &value, err);
  if (rc) return rc;
  char label[sizeof err->msg / 2];
  snprintf(label, sizeof label, "--set %s", assignment);
  source src = {NULL, label};
  rc = set_from_text(cfg, row, value, &src, err);
  if (!rc) cfg->origin[row].line = ORIGIN_SET, cfg->origin[row].col = 0;
  return rc;
}

/* ----------------------------------------------------------------- where */

static int row_of(const char *key) {
  const char *dot = strchr(key, '.');
  return dot ? st_config_key_find(key, (size_t)(dot - key), dot + 1) : -1;
}

const char *st_config_where(const st_config *cfg, const char *key) {
  /* A few rotating buffers, so two calls can sit in one printf. */
  static _Thread_local char ring[4][ST_PATH_MAX + 32];
  static _Thread_local int next;
  int row = row_of(key);
  if (row < 0) return "unknown key";
  struct st_config_origin o = cfg->origin[row];
  if (o.line == ORIGIN_SET) return "--set";
  if (o.line <= 0) return "default";
  char *buf = ring[next++ & 3];
  snprintf(buf, sizeof ring[0], "%s:%d:%d", cfg->path, o.line, o.col);
  return buf;
}

const char *st_config_set_at(const st_config *cfg, const char *key) {
  static _Thread_local char ring[4][ST_PATH_MAX + 40];
  static _Thread_local int next;
  const char *where = st_config_where(cfg, key);
  if (!strcmp(where, "default") || !strcmp(where, "unknown key"))
    return "the default";
  char *buf = ring[next++ & 3];
  snprintf(buf, sizeof ring[0], "set %s %s",
           strcmp(where, "--set") ? "at" : "by", where);
  return buf;
}

/* ------------------------------------------------------------ validation */

/* "<origin>: key: message", the origin as st_config_where gives it (a
 * file position first, so editors jump to it), as every later error that
 * names a key has it. */
static int invalid(const st_config *cfg, st_error *err, const char *key,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int invalid(const st_config *cfg, st_error *err, const char *key,
                   const char *fmt, ...) {
  char msg[sizeof err->msg];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return st_error_set(err, ST_ECONFIG, "%s: %s: %s", st_config_where(cfg, key),
                      key, msg);
}

/* A numeric range a key must lie in; open ends exclude the bound. */
typedef struct range {
  const char *key;
  double lo, hi;
  int lo_open, hi_open;
} range;

#define AT_LEAST(k, lo)                                                        \
  { k, lo, INFINITY, 0, 0 }
#define ABOVE(k, lo)                                                           \
  { k, lo, INFINITY, 1, 0 }
#define UNIT(k)                                                                \
  { k, 0, 1, 0, 1 } /* [0, 1) */
#define BETWEEN(k, lo, hi)                                                     \
  { k, lo, hi, 0, 0 }

/* The upper bounds are far past any real model or machine; they keep the
 * products the builder, the kernels (int indices) and the planner form
 * from overflowing: a key at 2^30 wrapped a width to 0 and trained. */
#define BIG (1 << 24)

static const range ranges[] = {
    UNIT("model.dropout"),
    AT_LEAST("model.groups", 1),
    BETWEEN("model.kernel", 1, 4096),
    BETWEEN("model.residual_blocks", 0, ST_MAX_BLOCKS),
    BETWEEN("model.classes", 2, BIG),
    BETWEEN("model.hidden", 1, BIG),
    BETWEEN("model.channels", 1, BIG),
    BETWEEN("model.dense", 1, BIG),
    BETWEEN("model.vocab", 0, BIG),
    BETWEEN("model.context", 1, BIG),
    BETWEEN("model.layers", 0, ST_MAX_BLOCKS),
    BETWEEN("model.heads", 1, BIG),
    BETWEEN("model.width", 1, BIG),
    BETWEEN("model.mlp_ratio", 1, 64),
    AT_LEAST("model.rotary_dim", 0),
    AT_LEAST("data.train_limit", 0),
    AT_LEAST("data.test_limit", 0),
    ABOVE("optimizer.lr", 0),
    UNIT("optimizer.momentum"),
    AT_LEAST("optimizer.weight_decay", 0),
    UNIT("optimizer.beta1"),
    UNIT("optimizer.beta2"),
    ABOVE("optimizer.eps", 0),
    AT_LEAST("optimizer.warmup_steps", 0),
    AT_LEAST("optimizer.min_lr", 0),
    AT_LEAST("optimizer.step_size", 1),
    ABOVE("optimizer.gamma", 0),
    BETWEEN("train.batch", 1, BIG),
    AT_LEAST("train.epochs", 0),
    AT_LEAST("train.steps", 0),
    AT_LEAST("train.eval_every", 0),
    AT_LEAST("train.checkpoint_every", 0),
    BETWEEN("train.threads", 0, 4096),
    AT_LEAST("train.keep_checkpoints", 0),
    AT_LEAST("execution.micro_batch", 0),
    AT_LEAST("execution.stages", 0),
    AT_LEAST("execution.virtual_stages", 1),
    AT_LEAST("execution.blocks_per_segment", 0),
    AT_LEAST("execution.replicas", 1),
    AT_LEAST("execution.pipemare_warmup", 0),
    UNIT("execution.pipemare_gamma"),
    BETWEEN("execution.prefetch", 0, ST_MAX_BLOCKS),
    AT_LEAST("execution.compute_memory_limit", 0),
    AT_LEAST("execution.rank_memory_limit", 0),
    AT_LEAST("execution.rank_timeout", 0),
    AT_LEAST("optimizer.reference_batch", 0),
    BETWEEN("fabric.cores", 0, 1 << 20),
    AT_LEAST("fabric.pe_flops", 0),
    AT_LEAST("fabric.pe_memory", 0),
    AT_LEAST("fabric.link_bandwidth", 0),
    AT_LEAST("fabric.hop_latency", 0),
    AT_LEAST("fabric.pe_overhead", 0),
    AT_LEAST("fabric.io_bandwidth", 0),
    AT_LEAST("fabric.memory_bandwidth", 0),
    AT_LEAST("metrics.log_every", 1),
};

static int in_range(const range *r, double v) {
  int lo_ok = r->lo_open ? v > r->lo : v >= r->lo;
  int hi_ok = r->hi_open ? v < r->hi : v <= r->hi;
  return lo_ok && hi_ok; /* false for NaN */
}

static void describe_range(const range *r, char *buf, size_t cap) {
  if (isinf(r->hi))
    snprintf(buf, cap, "%s %.10g", r->lo_open ? ">" : ">=", r->lo);
  else
    snprintf(buf, cap, "in %c%.10g, %.10g%c", r->lo_open ? '(' : '[', r->lo,
             r->hi, r->hi_open ? ')' : ']');
}

static double number_at(const st_config *cfg, const st_config_key *k) {
  const void *p = (const char *)cfg + k->offset;
  switch (k->type) {
  case ST_CONFIG_INT:
  case ST_CONFIG_BOOL:
    return *(const int *)p;
  case ST_CONFIG_INT64:
    return (double)*(const int64_t *)p;
  case ST_CONFIG_UINT64:
    return (double)*(const uint64_t *)p;
  case ST_CONFIG_FLOAT:
    return *(const float *)p;
  default:
    return NAN;
  }
}

static int check_range(const st_config *cfg, const range *r, st_error *err) {
  int row = row_of(r->key);
  if (row < 0) /* a typo in the table above must not skip a check quietly */
    return st_error_set(err, ST_ECONFIG, "%s: no such key to validate", r->key);
  const st_config_key *k = &st_config_schema[row];
  char rule[64];
  describe_range(r, rule, sizeof rule);
  if (k->type == ST_CONFIG_INT_LIST) {
    const st_int_list *l = (const st_int_list *)((const char *)cfg + k->offset);
    for (int i = 0; i < l->n; i++)
      if (!in_range(r, l->v[i]))
        return invalid(cfg, err, r->key,
                       "every entry must be %s, got %d at [%d]", rule, l->v[i],
                       i);
    return 0;
  }
  double v = number_at(cfg, k);
  if (!in_range(r, v)) {
    /* the value as written: whole for integers, and a float in the
     * fewest digits that read back as it (-0.1, not -0.100000001) */
    char got[32];
    snprintf(got, sizeof got, "%.17g", v);
    for (int d = 6; k->type == ST_CONFIG_FLOAT && d <= 9; d++) {
      snprintf(got, sizeof got, "%.*g", d, v);
      if (strtof(got, NULL) == (float)v) break;
    }
    return invalid(cfg, err, r->key, "must be %s, got %s", rule, got);
  }
  return 0;
}

/* Every enum field holds one of its choices (a caller may have filled the
 * struct by hand), and every string is terminated. */
static int check_strings(const st_config *cfg, st_error *err) {
  for (int i = 0; i < st_config_schema_count; i++) {
    const st_config_key *k = &st_config_schema[i];
    if (k->type != ST_CONFIG_ENUM && k->type != ST_CONFIG_STRING) continue;
    const char *s = (const char *)cfg + k->offset;
    key_text key = full_name(k);
    if (!memchr(s, '\0', k->size))
      return invalid(cfg, err, key.s, "not a terminated string");
    if (k->type == ST_CONFIG_ENUM && !is_choice(k->choices, s)) {
      char choices[256];
      list_choices(k->choices, choices, sizeof choices);
      return invalid(cfg, err, key.s, "'%s' is not one of %s", shown(s).s,
                     choices);
    }
  }
  return 0;
}

static int check_lists(const st_config *cfg, st_error *err) {
  const st_int_list *lists[] = {&cfg->model.hidden, &cfg->model.channels,
                                &cfg->model.dense,
                                &cfg->execution.stage_blocks};
  const char *keys[] = {"model.hidden", "model.channels", "model.dense",
                        "execution.stage_blocks"};
  for (int i = 0; i < 4; i++)
    if (lists[i]->n < 0 || lists[i]->n > ST_MAX_LIST)
      return invalid(cfg, err, keys[i], "has %d entries (0 to %d allowed)",
                     lists[i]->n, ST_MAX_LIST);
  const st_int_list *sb = &cfg->execution.stage_blocks;
  for (int i = 0; i < sb->n; i++)
    if (sb->v[i] < 1)
      return invalid(cfg, err, "execution.stage_blocks",
                     "entry %d is %d: a stage holds at least one block", i,
                     sb->v[i]);
  /* another mode ignores the pin (a notice, st_config_unused) */
  int pins = !strcmp(cfg->execution.mode, "pipeline") ||
             !strcmp(cfg->execution.mode, "pipelined_backprop");
  int S = cfg->execution.stages;
  /* the interleaved schedule's pin is its chunks': V to a stage worker */
  int V = !strcmp(cfg->execution.mode, "pipeline") &&
                  !strcmp(cfg->execution.schedule, "interleaved")
              ? cfg->execution.virtual_stages
              : 1;
  if (pins && V > 1 && sb->n > 0 && sb->n % V != 0)
    return invalid(cfg, err, "execution.stage_blocks",
                   "has %d chunks; the interleaved schedule gives each stage "
                   "worker execution.virtual_stages = %d of them (%s), so "
                   "the count must be a multiple of %d",
                   sb->n, V, st_config_set_at(cfg, "execution.virtual_stages"),
                   V);
  if (pins && V > 1 && sb->n > 0 && S > 0 && S * V != sb->n)
    return invalid(cfg, err, "execution.stage_blocks",
                   "has %d chunks; execution.stages %d (%s) x "
                   "execution.virtual_stages %d make %d: give one of the two, "
                   "or both alike",
                   sb->n, S, st_config_set_at(cfg, "execution.stages"), V,
                   S * V);
  if (pins && V > 1) return 0;
  if (pins && sb->n > 0 && S != 0 && S != sb->n)
    return S == ST_STAGES_PER_BLOCK
               ? invalid(cfg, err, "execution.stage_blocks",
                         "has %d stages; execution.stages is per_block "
                         "(%s): give one of the two",
                         sb->n, st_config_set_at(cfg, "execution.stages"))
               : invalid(cfg, err, "execution.stage_blocks",
                         "has %d stages; execution.stages is %d (%s): give "
                         "one of the two, or both alike",
                         sb->n, S, st_config_set_at(cfg, "execution.stages"));
  return 0;
}

/* Checks that involve the model's shape or more than one key. */
static int check_model(const st_config *cfg, st_error *err) {
  const int cnn = !strcmp(cfg->model.kind, "cnn");
  if (cfg->model.kernel % 2 == 0)
    return invalid(cfg, err, "model.kernel",
                   "must be odd ('same' padding), got %d", cfg->model.kernel);
  if (cnn && cfg->model.channels.n == 0)
    return invalid(cfg, err, "model.channels",
                   "a cnn needs at least one conv stage, got []");
  if (!strcmp(cfg->model.norm, "layernorm") && cnn)
    return invalid(cfg, err, "model.norm",
                   "layernorm is for an mlp; model.kind is cnn (%s), which "
                   "uses groupnorm",
                   st_config_set_at(cfg, "model.kind"));
  if (!strcmp(cfg->model.norm, "groupnorm") && !cnn)
    return invalid(cfg, err, "model.norm",
                   "groupnorm is for a cnn; model.kind is %s (%s), which "
                   "uses layernorm",
                   cfg->model.kind, st_config_set_at(cfg, "model.kind"));
  if (!strcmp(cfg->model.norm, "groupnorm"))
    for (int i = 0; i < cfg->model.channels.n; i++)
      if (cfg->model.channels.v[i] % cfg->model.groups != 0)
        return invalid(cfg, err, "model.groups",
                       "%d groups do not divide model.channels[%d] = %d (%s)",
                       cfg->model.groups, i, cfg->model.channels.v[i],
                       st_config_set_at(cfg, "model.channels"));
  return 0;
}

static int check_training(const st_config *cfg, st_error *err) {
  const int mb = cfg->execution.micro_batch, batch = cfg->train.batch;
  if (mb > 0 && batch % mb != 0)
    return invalid(cfg, err, "execution.micro_batch",
                   "%d does not divide train.batch = %d (%s)", mb, batch,
                   st_config_set_at(cfg, "train.batch"));
  const int R = cfg->execution.replicas,
            mode_seq = !strcmp(cfg->execution.mode, "sequential");
  if (R > 1 && !mode_seq && strcmp(cfg->execution.mode, "pipeline"))
    return invalid(cfg, err, "execution.replicas",
                   "%d replicas of execution.mode %s (%s): replicas run "
                   "the sequential and pipeline modes",
                   R, cfg->execution.mode,
                   st_config_set_at(cfg, "execution.mode"));
  /* a micro-batch of the whole batch is micro_batch 0: each replica runs
   * its share whole (st_replicas_split) */
  if (R > 1 && batch % (R * (mb > 0 && mb < batch ? mb : 1)) != 0)
    return invalid(cfg, err, "execution.replicas",
                   "train.batch = %d (%s) does not split into %d replicas "
                   "of whole micro-batches (execution.micro_batch = %d)",
                   batch, st_config_set_at(cfg, "train.batch"), R, mb);
  if (R > 1 && cfg->metrics.noise_scale)
    return invalid(cfg, err, "metrics.noise_scale",
                   "is not available with execution.replicas = %d yet", R);
  const int pb = !strcmp(cfg->execution.mode, "pipelined_backprop");
  const int sgd = !strcmp(cfg->optimizer.kind, "sgd");
  const char *mit = cfg->execution.mitigation;
  if (pb && !sgd && strcmp(mit, "none") && strcmp(mit, "stash"))
    return invalid(cfg, err, "execution.mitigation",
                   "%s is defined for momentum SGD (BACKGROUND.md 2); with "
                   "optimizer.kind %s (%s) use none or stash",
                   mit, cfg->optimizer.kind,
                   st_config_set_at(cfg, "optimizer.kind"));
  if (pb && cfg->optimizer.nesterov)
    return invalid(cfg, err, "optimizer.nesterov",
                   "pipelined_backprop updates with heavy-ball momentum "
                   "(BACKGROUND.md 2); set optimizer.nesterov: false");
  if (pb && cfg->metrics.noise_scale)
    return invalid(cfg, err, "metrics.noise_scale",
                   "is not available in pipelined_backprop (every update "
                   "sees one micro-batch)");
  /* the pipeline executor (both modes) refuses it too (pipeline.c): here
   * so that compile refuses what train refuses, and says so first */
  if (cfg->metrics.noise_scale &&
      (!strcmp(cfg->execution.mode, "pipeline") ||
       !strcmp(cfg->execution.mode, "block_sequential")))
    return invalid(cfg, err, "metrics.noise_scale",
                   "is not available in the %s mode yet; sequential and "
                   "weight_streaming measure it",
                   cfg->execution.mode);
  if (cfg->optimizer.reference_batch > 0 && !sgd)
    return invalid(cfg, err, "optimizer.reference_batch",
                   "rescales SGD's lr and momentum; optimizer.kind is %s (%s)",
                   cfg->optimizer.kind,
                   st_config_set_at(cfg, "optimizer.kind"));
  if (cfg->optimizer.nesterov && !(cfg->optimizer.momentum > 0))
    return invalid(cfg, err, "optimizer.nesterov",
                   "needs optimizer.momentum > 0, got %g (%s)",
                   (double)cfg->optimizer.momentum,
                   st_config_set_at(cfg, "optimizer.momentum"));
  const char *sched = cfg->optimizer.schedule;
  if ((!strcmp(sched, "cosine") || !strcmp(sched, "linear")) &&
      cfg->optimizer.min_lr > cfg->optimizer.lr)
    return invalid(cfg, err, "optimizer.min_lr",
                   "%g is above optimizer.lr = %g (%s)",
                   (double)cfg->optimizer.min_lr, (double)cfg->optimizer.lr,
                   st_config_set_at(cfg, "optimizer.lr"));
  if (!strcmp(cfg->data.dataset, "fashion_mnist") && !cfg->data.dir[0])
    return invalid(cfg, err, "data.dir", "fashion_mnist needs a folder");
  const int gpt = !strcmp(cfg->model.kind, "gpt");
  const int text = !strcmp(cfg->data.dataset, "text");
  if (gpt != text)
    return invalid(cfg, err, gpt ? "model.kind" : "data.dataset",
                   gpt ? "gpt trains on data.dataset text, not %s (%s)"
                       : "text data needs model.kind gpt, not %s (%s)",
                   gpt ? cfg->data.dataset : cfg->model.kind,
                   st_config_set_at(cfg, gpt ? "data.dataset" : "model.kind"));
  if (text && !(cfg->data.val_fraction > 0 && cfg->data.val_fraction < 1))
    return invalid(cfg, err, "data.val_fraction", "must be in (0, 1), got %g",
                   (double)cfg->data.val_fraction);
  if (text && !cfg->data.path[0])
    return invalid(cfg, err, "data.path", "text data needs a corpus file");
  /* the byte tokenizer is no file: its ids are known here, so compile
   * refuses the vocabulary that train refuses (a tokenizer file's ids only
   * the trainer, which reads it, knows) */
  if (text && cfg->model.vocab > 0 && cfg->model.vocab < 256 &&
      (!cfg->data.tokenizer[0] || !strcmp(cfg->data.tokenizer, "bytes")))
    return invalid(cfg, err, "model.vocab",
                   "%d, but the tokenizer (bytes) makes ids up to 255",
                   cfg->model.vocab);
  if (cfg->metrics.noise_scale) {
    /* gradients at two batch sizes: the first micro-batch and the batch */
    if (mb ? mb >= batch : batch < 2 || batch % 2)
      return invalid(cfg, err, "metrics.noise_scale",
                     "needs two gradient sizes: an even train.batch >= 2 "
                     "(%d) or an execution.micro_batch below it (%d)",
                     batch, mb);
    if (!(cfg->metrics.noise_ema >= 0 && cfg->metrics.noise_ema < 1))
      return invalid(cfg, err, "metrics.noise_ema", "must be in [0, 1), got %g",
                     (double)cfg->metrics.noise_ema);
  }
  return 0;
}

/* Keys only some settings read: `key` is read only where the value of
 * `by` (an enum or a bool) is a word of `values`; a key with several rows
 * needs all of them, and the first it fails says why it is not read. Each
 * row is what the code that consumes the key reads: the executors for the
 * modes (docs/modes.md), model.c's builders, trainer.c's load_data and
 * data/, optim.c's rules and st_lr_at. Every other key applies to every
 * setting, or is refused where it cannot apply (execution.replicas,
 * optimizer.reference_batch). */
static const struct {
  const char *key, *by, *values;
} key_reads[] = {
    {"execution.schedule", "execution.mode", "pipeline"},
    {"execution.virtual_stages", "execution.mode", "pipeline"},
    {"execution.virtual_stages", "execution.schedule", "interleaved"},
    {"execution.stages", "execution.mode",
     "pipeline block_sequential pipelined_backprop"},
    {"execution.stage_blocks", "execution.mode", "pipeline pipelined_backprop"},
    {"execution.blocks_per_segment", "execution.mode", "block_sequential"},
    {"execution.mitigation", "execution.mode", "pipelined_backprop"},
    {"execution.emulate", "execution.mode", "pipelined_backprop"},
    {"execution.pipemare_warmup", "execution.mode", "pipelined_backprop"},
    {"execution.pipemare_gamma", "execution.mode", "pipelined_backprop"},
    {"execution.store", "execution.mode", "weight_streaming"},
    {"execution.store_path", "execution.mode", "weight_streaming"},
    {"execution.store_weights", "execution.mode", "weight_streaming"},
    {"execution.store_rounding", "execution.mode", "weight_streaming"},
    {"execution.prefetch", "execution.mode", "weight_streaming"},
    {"execution.keep_activations", "execution.mode", "weight_streaming"},
    {"execution.compute_memory_limit", "execution.mode", "weight_streaming"},
    /* build_mlp, build_cnn, build_gpt: a gpt's layernorms are its own and
     * its classes are its vocabulary */
    {"model.hidden", "model.kind", "mlp"},
    {"model.residual", "model.kind", "mlp"},
    {"model.norm", "model.kind", "mlp cnn"},
    {"model.groups", "model.kind", "cnn"},
    {"model.groups", "model.norm", "groupnorm"},
    {"model.channels", "model.kind", "cnn"},
    {"model.kernel", "model.kind", "cnn"},
    {"model.residual_blocks", "model.kind", "cnn"},
    {"model.pool", "model.kind", "cnn"},
    {"model.dense", "model.kind", "cnn"},
    {"model.classes", "model.kind", "mlp cnn"},
    {"model.vocab", "model.kind", "gpt"},
    {"model.context", "model.kind", "gpt"},
    {"model.layers", "model.kind", "gpt"},
    {"model.heads", "model.kind", "gpt"},
    {"model.width", "model.kind", "gpt"},
    {"model.mlp_ratio", "model.kind", "gpt"},
    {"model.tied", "model.kind", "gpt"},
    {"model.fused_loss", "model.kind", "gpt"},
    {"model.positions", "model.kind", "gpt"},
    {"model.rotary_dim", "model.kind", "gpt"},
    {"model.rotary_dim", "model.positions", "rotary"},
    /* load_data: the IDX files' folder, pixel statistics, a corpus */
    {"data.dir", "data.dataset", "fashion_mnist"},
    {"data.normalize", "data.dataset", "fashion_mnist synthetic"},
    {"data.path", "data.dataset", "text"},
    {"data.tokenizer", "data.dataset", "text"},
    {"data.encoding", "data.dataset", "text"},
    {"data.val_fraction", "data.dataset", "text"},
    /* sgd_one, adamw_one, st_lr_at */
    {"optimizer.momentum", "optimizer.kind", "sgd"},
    {"optimizer.nesterov", "optimizer.kind", "sgd"},
    {"optimizer.beta1", "optimizer.kind", "adamw"},
    {"optimizer.beta2", "optimizer.kind", "adamw"},
    {"optimizer.eps", "optimizer.kind", "adamw"},
    {"optimizer.min_lr", "optimizer.schedule", "cosine linear"},
    {"optimizer.step_size", "optimizer.schedule", "step"},
    {"optimizer.gamma", "optimizer.schedule", "step"},
    /* only a gpt's sequence layers keep bf16 inputs (mark_transient) */
    {"train.bf16_activations", "model.kind", "gpt"},
    {"train.bf16_activations", "train.precision", "bf16"},
    {"metrics.noise_ema", "metrics.noise_scale", "true"},
};

/* Whether word is a word of the space-separated list. */
static int listed(const char *list, const char *word) {
  size_t n = strlen(word);
  for (const char *p = list; (p = strstr(p, word)); p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return 1;
  return 0;
}

/* Whether row k holds the same value in cfg and def (the defaults, or
 * another config). */
static int same_value(const st_config *cfg, const st_config *def, int k) {
  const st_config_key *key = &st_config_schema[k];
  const char *a = (const char *)cfg + key->offset,
             *b = (const char *)def + key->offset;
  if (key->type == ST_CONFIG_STRING || key->type == ST_CONFIG_ENUM)
    return strcmp(a, b) == 0;
  if (key->type == ST_CONFIG_INT_LIST) {
    const st_int_list *x = (const void *)a, *y = (const void *)b;
    return x->n == y->n && !memcmp(x->v, y->v, (size_t)x->n * sizeof *x->v);
  }
  return memcmp(a, b, key->size) == 0;
}

/* The value of an enum or bool key as a word: "sgd", "true". */
static const char *word_of(const st_config *cfg, const char *key) {
  int row = row_of(key);
  assert(row >= 0);
  const st_config_key *k = &st_config_schema[row];
  const char *p = (const char *)cfg + k->offset;
  if (k->type == ST_CONFIG_BOOL) return *(const int *)p ? "true" : "false";
  assert(k->type == ST_CONFIG_ENUM);
  return p;
}

/* The row of key_reads that leaves key unread in cfg, or -1 if it is read. */
static int unread_by(const st_config *cfg, const char *key) {
  for (size_t i = 0; i < sizeof key_reads / sizeof key_reads[0]; i++)
    if (!strcmp(key_reads[i].key, key) &&
        !listed(key_reads[i].values, word_of(cfg, key_reads[i].by)))
      return (int)i;
  return -1;
}

int st_config_unused(const st_config *cfg, const char **keys, int cap) {
  st_config def;
  st_config_defaults(&def);
  int n = 0;
  for (int k = 0; k < st_config_schema_count; k++) {
    key_text key = full_name(&st_config_schema[k]);
    int i = unread_by(cfg, key.s);
    if (i < 0 || same_value(cfg, &def, k)) continue;
    if (n < cap) keys[n] = key_reads[i].key;
    n++;
  }
  return n;
}

const char *st_config_unused_why(const st_config *cfg, const char *key) {
  static _Thread_local char ring[4][96];
  static _Thread_local int next;
  int i = unread_by(cfg, key);
  if (i < 0) return NULL;
  char *buf = ring[next++ & 3];
  snprintf(buf, sizeof ring[0], "%s %s", key_reads[i].by,
           word_of(cfg, key_reads[i].by));
  return buf;
}

int st_config_validate(const st_config *cfg, st_error *err) {
  int rc = check_strings(cfg, err);
  if (!rc) rc = check_lists(cfg, err);
  for (size_t i = 0; !rc && i < sizeof ranges / sizeof ranges[0]; i++)
    rc = check_range(cfg, &ranges[i], err);
  if (!rc) rc = check_model(cfg, err);
  if (!rc) rc = check_training(cfg, err);
  return rc;
}

/* --------------------------------------------------------------- writing */

/* Fewest digits that read back (strtof) as the same float: "0.05", not
 * "0.0500000007"; 9 significant digits always suffice for a float. */
static void write_float(FILE *f, float v) {
  char buf[32];
  for (int digits = 1; digits <= 9; digits++) {
    snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
    if (strtof(buf, NULL) == v) break;
  }
  fputs(buf, f);
}

/* Double-quoted YAML string, so any path reads back verbatim: what YAML's
 * reader refuses raw (C1 controls, U+FFFE, U+FFFF) or takes for a line
 * break (NEL, U+0085) is escaped too, as the string's own escapes wrote it
 * (the strings are UTF-8: libyaml read them). */
static void write_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s, c1 = (unsigned char)s[1];
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20 || c == 0x7f)
      fprintf(f, "\\x%02x", c);
    else if (c == 0xc2 && c1 >= 0x80 && c1 <= 0x9f) /* U+0080 to U+009F */
      fprintf(f, "\\x%02x", c1), s++;
    else if (c == 0xef && c1 == 0xbf && ((unsigned char)s[2] & 0xfe) == 0xbe)
      fprintf(f, "\\u%04x", 0xfffe + (s[2] & 1)), s += 2; /* U+FFFE, FFFF */
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static void write_value(FILE *f, const st_config *cfg, const st_config_key *k) {
  const void *p = (const char *)cfg + k->offset;
  switch (k->type) {
  case ST_CONFIG_INT:
    if (*(const int *)p == ST_STAGES_PER_BLOCK &&
        !strcmp(k->section, "execution") && !strcmp(k->name, "stages"))
      fputs("per_block", f);
    else
      fprintf(f, "%d", *(const int *)p);
    break;
  case ST_CONFIG_INT64:
    fprintf(f, "%" PRId64, *(const int64_t *)p);
    break;
  case ST_CONFIG_UINT64:
    fprintf(f, "%" PRIu64, *(const uint64_t *)p);
    break;
  case ST_CONFIG_FLOAT:
    write_float(f, *(const float *)p);
    break;
  case ST_CONFIG_BOOL:
    fputs(*(const int *)p ? "true" : "false", f);
    break;
  case ST_CONFIG_ENUM:
    fputs((const char *)p, f);
    break; /* a bare word */
  case ST_CONFIG_STRING:
    write_string(f, (const char *)p);
    break;
  case ST_CONFIG_INT_LIST: {
    const st_int_list *l = p;
    fputc('[', f);
    for (int i = 0; i < l->n; i++) fprintf(f, "%s%d", i ? ", " : "", l->v[i]);
    fputc(']', f);
    break;
  }
  }
}

int st_config_write(const st_config *cfg, FILE *f) {
  const char *section = "";
  fprintf(f, "# strata config, fully resolved (defaults, file, --set); keys "
             "in docs/config.md\n");
  for (int i = 0; i < st_config_schema_count; i++) {
    const st_config_key *k = &st_config_schema[i];
    if (strcmp(k->section, section) != 0) {
      section = k->section;
      fprintf(f, "%s%s:\n", i ? "\n" : "", section);
    }
    fprintf(f, "  %s: ", k->name);
    write_value(f, cfg, k);
    fputc('\n', f);
  }
  return ferror(f) ? ST_EIO : 0;
}

int st_config_changes(const st_config *was, const st_config *now, FILE *f) {
  int n = 0;
  for (int i = 0; i < st_config_schema_count; i++) {
    if (same_value(was, now, i)) continue;
    const st_config_key *k = &st_config_schema[i];
    fprintf(f, "%s%s ", n++ ? ", " : "", full_name(k).s);
    write_value(f, was, k);
    fputs(" -> ", f);
    write_value(f, now, k);
  }
  return n;
}
