/* replicas.c — placeholder until the data-parallel executor lands. */
#include "exec.h"

static int rep_create(void **state, const st_model *m, const st_config *cfg,
                      int micro_batch, int max_batch, st_error *err) {
  (void)state, (void)m, (void)micro_batch, (void)max_batch;
  return st_error_set(err, ST_EUNSUPPORTED,
                      "%s: execution.replicas is not available yet",
                      st_config_where(cfg, "execution.replicas"));
}

const st_executor st_exec_replicas = {.mode = "replicas", .create = rep_create};
