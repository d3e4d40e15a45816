/*
 * schema.h — private to src/config/: the shape of the one table of config
 * keys (schema.c) that parsing, validation, writing, --help and
 * docs/config.md all read, so a key is declared exactly once.
 */
#ifndef STRATA_CONFIG_SCHEMA_H
#define STRATA_CONFIG_SCHEMA_H

#include "strata.h"

typedef enum {
  ST_CONFIG_INT,      /* int */
  ST_CONFIG_INT64,    /* int64_t */
  ST_CONFIG_UINT64,   /* uint64_t */
  ST_CONFIG_FLOAT,    /* float */
  ST_CONFIG_BOOL,     /* int, 0 or 1 */
  ST_CONFIG_STRING,   /* char[size] */
  ST_CONFIG_ENUM,     /* char[size], one of choices */
  ST_CONFIG_INT_LIST, /* st_int_list */
} st_config_type;

typedef struct st_config_key {
  const char *section; /* "model" */
  const char *name;    /* "hidden" */
  st_config_type type;
  size_t offset;              /* of the field in st_config */
  size_t size;                /* of the field, bytes */
  const char *def;            /* default, in YAML syntax */
  const char *const *choices; /* enum: NULL-terminated; else NULL */
  const char *meaning;        /* one line for --help and docs */
} st_config_key;

/* Rows in section order; sections appear as one contiguous run each. */
extern const st_config_key st_config_schema[];
extern const int st_config_schema_count;

/* Index of section.name in the table, or -1. The section is given with its
 * length so "model.hidden" can be looked up without copying. */
int st_config_key_find(const char *section, size_t section_len,
                       const char *name);
/* Index of the first row of this section, or -1 if no row belongs to it. */
int st_config_section_find(const char *section);
/* "int", "float", "int list", ... as docs and --help show them. */
const char *st_config_type_name(st_config_type type);
/* The table as the Markdown body of docs/config.md (tests check it is in
 * sync; STRATA_UPDATE_DOCS=1 makes the config test rewrite it). */
void st_config_schema_markdown(FILE *f);

#endif
