/*
 * error.c — error codes, their text (one table in strata.h) and st_error_set.
 * Library code reports failures through st_error; only cli/ prints and exits.
 */
#include "strata.h"

#include <stdarg.h>
#include <string.h>

int st_error_set(st_error *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    err->code = code;
    /* Messages are one line: fold any newline a caller let through. */
    for (char *p = err->msg; *p; p++)
      if (*p == '\n') *p = ' ';
  }
  return code;
}

const char *st_error_text(int code) {
  switch (code) {
#define ST_ERROR_CASE(name, value, text)                                       \
  case value:                                                                  \
    return text;
    ST_ERROR_MAP(ST_ERROR_CASE)
#undef ST_ERROR_CASE
  }
  return "unknown error";
}
