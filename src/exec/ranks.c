/*
 * ranks.c — data parallelism across MPI ranks (mpirun -np R strata train):
 * rank r is replica r of the in-process data-parallel mode (replicas.c),
 * running the configured mode (sequential or pipeline) on its share of
 * the batch with all of its process's cores. After the share's backward
 * the ranks exchange their losses (each rank's slice, all-gathered, so
 * every rank checks the whole batch's loss as the sequential mode does)
 * and sum their gradients in rank order (src/dist/mpi.c), then every rank
 * applies the same update to its own copy of the weights.
 *
 * Contract: the weights after every step are the in-process replicas' at
 * the same R, bit for bit: rank r computes replica r's gradient from the
 * same samples with the same kernels (thread counts change no bits), and
 * the sum adds the ranks' gradients element by element in the order the
 * replicas add their slabs, ((g0 + g1) + g2) + ..., whatever the MPI
 * library's own algorithms (execution.deterministic: false hands the sum
 * to MPI_Allreduce instead: the library's order, maybe faster). Every rank reads the whole batch (the data is
 * small beside the step) and takes its share.
 */
#include "exec.h"

#include "../dist/dist.h"

#include <stdlib.h>
#include <string.h>

typedef struct ranks {
  const st_executor *inner;
  const st_model *model;
  int rank, share, mb;
  st_config cfg; /* the inner executor's: this rank's share, one replica */
  void *state;   /* the inner executor's */
  float *scratch; /* st_dist_sum_scratch floats: the exchange's parts */
  double busy;
} ranks;

static void ranks_destroy(void *state) {
  ranks *p = state;
  if (!p) return;
  if (p->state) p->inner->destroy(p->state);
  st_free(p->scratch);
  free(p);
}

static int ranks_create(void **state, const st_model *m, const st_config *cfg,
                        int micro_batch, int max_batch, st_error *err) {
  *state = NULL;
  /* The errors here come from the config, which every rank shares (the
   * trainer checked): each rank finds the same one. */
  st_dist_share_error();
  const int W = st_dist_size();
  if (cfg->execution.replicas != 1 && cfg->execution.replicas != W)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.replicas: %d, but mpirun started %d "
                        "ranks: one replica per rank (1 takes the number of "
                        "ranks)",
                        st_config_where(cfg, "execution.replicas"),
                        cfg->execution.replicas, W);
  if (cfg->metrics.noise_scale)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: metrics.noise_scale is measured in one process "
                        "(not over MPI ranks yet)",
                        st_config_where(cfg, "metrics.noise_scale"));
  if (strcmp(cfg->execution.mode, "weight_streaming") == 0)
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: execution.mode: weight_streaming runs in one "
                        "process (a store serving several ranks is not "
                        "built)",
                        st_config_where(cfg, "execution.mode"));
  st_config world = *cfg; /* the replicas: the ranks */
  world.execution.replicas = W;
  const st_executor *inner;
  int share, mb;
  int rc = st_replicas_split(&world, micro_batch, &inner, &share, &mb, err);
  if (rc) return rc;
  ranks *p = calloc(1, sizeof *p);
  if (!p) return st_error_set(err, ST_ENOMEM, "out of memory");
  p->inner = inner;
  p->model = m;
  p->rank = st_dist_rank();
  p->share = share;
  p->mb = mb;
  p->cfg = *cfg;
  p->cfg.train.batch = share;
  p->cfg.execution.micro_batch = mb;
  p->cfg.execution.replicas = 1;
  /* the rank's share of its machine's cores, as the trainer's pool; ranks
   * sharing a machine would pin their stages to the same cores */
  if (p->cfg.train.threads == 0) {
    int per = st_usable_cores() / st_dist_local_size();
    p->cfg.train.threads = per > 0 ? per : 1;
  }
  if (st_dist_local_size() > 1) p->cfg.execution.pin = 0;
  /* from here a failure may be this rank's alone (memory, threads): every
   * rank learns of it, so none waits in the first step's exchange */
  st_dist_unshare_error();
  rc = inner->create(&p->state, m, &p->cfg, mb, max_batch, err);
  if (!rc && cfg->execution.deterministic &&
      !(p->scratch =
            st_alloc(st_dist_sum_scratch(m->n_params) * sizeof(float))))
    rc = st_error_set(err, ST_ENOMEM,
                      "out of memory for the gradient exchange");
  rc = st_dist_agree(rc, err);
  if (rc) {
    ranks_destroy(p);
    return rc;
  }
  *state = p;
  return 0;
}

static int ranks_step(void *state, st_trainer_view *v, double *loss,
                      st_error *err) {
  ranks *p = state;
  const st_model *m = p->model;
  double start = st_now(), inner_loss;
  st_trainer_view w;
  st_replica_view(&w, v, m, p->rank, p->share, p->mb);
  int rc = p->inner->step(p->state, &w, &inner_loss, err);
  /* every rank learns whether any failed: the first in rank order stops
   * them all before any weight changes */
  rc = st_dist_agree(rc, err);
  size_t rows = (size_t)m->label_rows;
  if (!rc)
    rc = st_dist_allgather(v->losses, (size_t)p->share * rows * sizeof(float),
                           err);
  if (!rc && (rc = st_trainer_check_loss(v, loss, err)))
    st_dist_share_error(); /* every rank checked the same losses */
  if (!rc) {
    double t0 = st_now();
    rc = p->cfg.execution.deterministic
             ? st_dist_sum_ranks(v->grads, m->n_params, p->scratch, err)
             : st_dist_allreduce(v->grads, m->n_params, err);
    if (v->trace)
      st_trace_add(v->trace, v->track, ST_TRACE_REDUCE, v->step, -1, t0,
                   st_now());
  }
  if (rc) {
    memset(v->grads, 0, m->n_params * sizeof(float));
    p->busy += st_now() - start;
    return rc;
  }
  double t0 = st_now();
  st_trainer_update_blocks(v, 0, m->n_blocks);
  if (v->trace)
    st_trace_add(v->trace, v->track, ST_TRACE_UPDATE, v->step, -1, t0,
                 st_now());
  p->busy += st_now() - start;
  return 0;
}

static const float *ranks_forward(void *state, const st_ctx *ctx,
                                  const float *params, const float *x, int B) {
  ranks *p = state;
  return p->inner->forward(p->state, ctx, params, x, B);
}

static int ranks_stages(void *state) {
  ranks *p = state;
  return p->inner->stages ? p->inner->stages(p->state) : 1;
}

/* This rank's tracks, as its inner mode names them; *wall is this
 * executor's time inside steps (the exchange and update included). */
static int ranks_stats(void *state, st_track_stats *out, int cap,
                       double *wall) {
  ranks *p = state;
  double inner_wall;
  int n = p->inner->stats(p->state, out, cap, &inner_wall);
  *wall = p->busy;
  return n;
}

const st_executor st_exec_ranks = {
    .mode = "ranks",
    .step = ranks_step,
    .forward = ranks_forward,
    .create = ranks_create,
    .destroy = ranks_destroy,
    .stages = ranks_stages,
    .stats = ranks_stats,
};
