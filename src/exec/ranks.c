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
 * to MPI_Allreduce instead: the library's order, maybe faster). Every rank
 * reads the whole batch (the data is small beside the step) and takes its
 * share.
 *
 * execution.placement: ranks spreads a pipeline's stages over the ranks
 * instead (pipeline, block_sequential, pipelined_backprop; pipeline.c and
 * pb.c send the activations and gradients between ranks). With replicas R
 * the W ranks form a grid: replica i is ranks i P .. i P + P - 1 (P = W /
 * R), a pipeline of its share of the batch; the R ranks holding the same
 * stage sum that stage's gradients in replica order and update it, as the
 * in-process replicas of the pipeline do. Each rank holds only its own
 * stages' weights, gradients and optimizer state (the trainer commits only
 * their ranges of its slabs: st_executor.owns) and activations; nothing
 * holds the whole model. Evaluation runs the test batches through the
 * stages, rank to rank, and broadcasts the logits from the last stage;
 * a checkpoint is one safetensors file that rank 0 writes tensor by
 * tensor as the stages' ranks send them (the file the threaded pipeline
 * writes, byte for byte), and each rank resumes by reading its own
 * tensors from it. The last stage's rank holds the losses; they are
 * broadcast to every rank.
 */
#include "exec.h"

#include "../dist/dist.h"

#include <stdlib.h>
#include <string.h>

typedef struct ranks {
  const st_executor *inner;
  const st_model *model;
  int rank, share, mb;
  /* placement: ranks — this rank's pipeline (its members are the stages'
   * ranks) and, with replicas, the ranks of the same stage in the other
   * replicas; every stage's blocks and owner */
  int placed, R, P, replica, last_owner;
  st_dist_group *pipeline, *peers;
  int S, *first, *count, *owner;
  /* evaluation and checkpoints, on a communicator of their own (the
   * pipeline's posted receives never see them): each own stage's blocks
   * at the evaluation batch, the input received from another rank, the
   * logits every member gets, one tensor on its way to rank 0 */
  st_dist_group *xfer;
  st_stage **eval;
  float *eval_in, *logits, *tensor;
  int max_batch;
  st_config cfg;  /* the inner executor's: this rank's share, one replica */
  void *state;    /* the inner executor's */
  float *scratch; /* st_dist_sum_scratch floats: the exchange's parts */
  double busy;
} ranks;

static void ranks_destroy(void *state) {
  ranks *p = state;
  if (!p) return;
  if (p->state) p->inner->destroy(p->state);
  st_free(p->scratch);
  for (int s = 0; p->eval && s < p->S; s++) st_stage_destroy(p->eval[s]);
  free(p->eval);
  st_free(p->eval_in);
  st_free(p->logits);
  st_free(p->tensor);
  st_dist_group_destroy(p->pipeline);
  st_dist_group_destroy(p->peers);
  st_dist_group_destroy(p->xfer);
  free(p->first);
  free(p);
}

/* Stage s's slab range. */
static void stage_range(const ranks *p, int s, size_t *off, size_t *n) {
  const st_block *lo = &p->model->blocks[p->first[s]],
                 *hi = &p->model->blocks[p->first[s] + p->count[s] - 1];
  *off = lo->param_off;
  *n = hi->param_off + hi->n_params - lo->param_off;
}

/* The stage whose slab range holds offset at. */
static int stage_at(const ranks *p, size_t at) {
  for (int s = 0; s < p->S; s++) {
    size_t off, n;
    stage_range(p, s, &off, &n);
    if (at >= off && at < off + n) return s;
  }
  return -1;
}

/* A tensor tied to one that another rank updates (a GPT's head and token
 * embedding in stages on two ranks): its gradient and weights would have
 * to cross ranks every step, which is not built. */
static int tie_crosses(const ranks *p) {
  const st_model *m = p->model;
  for (int s = 0; s < p->S; s++)
    for (int b = p->first[s]; b < p->first[s] + p->count[s]; b++)
      for (int t = 0; t < m->blocks[b].n_tensors; t++) {
        long tie = m->blocks[b].tensors[t].tie;
        if (tie >= 0 && p->owner[stage_at(p, (size_t)tie)] != p->owner[s])
          return 1;
      }
  return 0;
}

/* Evaluation over the stages' ranks: each own stage's blocks at up to
 * max_batch samples, a buffer for an input from another rank, the
 * logits; rank 0 of a checkpoint's writers a buffer for the largest
 * tensor. */
static int eval_create(ranks *p, const st_model *m, int max_batch,
                       st_error *err) {
  int me = p->rank % p->P, rc = 0;
  size_t in = 0, most = 0;
  p->max_batch = max_batch;
  if (!(p->eval = calloc((size_t)p->S, sizeof *p->eval)))
    return st_error_set(err, ST_ENOMEM, "out of memory");
  for (int s = 0; !rc && s < p->S; s++) {
    if (p->owner[s] != me) continue;
    rc = st_stage_create(&p->eval[s], m, p->first[s], p->count[s], max_batch,
                         err);
    size_t n = st_shape_numel(m->blocks[p->first[s]].in);
    if (s > 0 && p->owner[s - 1] != me && n > in) in = n;
  }
  for (int i = 0; i < m->n_blocks; i++)
    for (int t = 0; t < m->blocks[i].n_tensors; t++)
      if (m->blocks[i].tensors[t].numel > most)
        most = m->blocks[i].tensors[t].numel;
  size_t logits = (size_t)max_batch * m->label_rows * m->out_cols;
  if (!rc &&
      ((in && !(p->eval_in = st_alloc(in * max_batch * sizeof(float)))) ||
       !(p->logits = st_alloc(logits * sizeof(float))) ||
       (p->rank == 0 && !(p->tensor = st_alloc(most * sizeof(float))))))
    rc = st_error_set(err, ST_ENOMEM, "out of memory for evaluation");
  return rc;
}

/* execution.placement: ranks — the pipeline (or grid) over the ranks. */
static int placed_create(ranks *p, const st_model *m, const st_config *cfg,
                         int micro_batch, int max_batch, st_error *err) {
  const int W = st_dist_size();
  const char *mode = cfg->execution.mode;
  int pb = !strcmp(mode, "pipelined_backprop");
  int bs = !strcmp(mode, "block_sequential");
  if (!pb && !bs && strcmp(mode, "pipeline"))
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.placement: ranks spreads a pipeline's "
                        "stages over the ranks, and execution.mode %s has "
                        "one stage (%s); placement: threads makes each rank "
                        "a replica",
                        st_config_where(cfg, "execution.placement"), mode,
                        st_config_set_at(cfg, "execution.mode"));
  if (pb && cfg->execution.emulate)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.emulate runs every stage in one "
                        "thread, not over ranks (execution.placement: "
                        "ranks)",
                        st_config_where(cfg, "execution.emulate"));
  p->R = cfg->execution.replicas;
  if (W % p->R)
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.replicas: %d replicas do not split "
                        "%d ranks into pipelines of equal size",
                        st_config_where(cfg, "execution.replicas"), p->R, W);
  p->P = W / p->R;
  p->replica = p->rank / p->P;
  p->share = cfg->train.batch;
  p->mb = micro_batch;
  int rc = 0;
  if (p->R > 1) {
    const st_executor *inner;
    rc = st_replicas_split(cfg, micro_batch, &inner, &p->share, &p->mb, err);
    if (rc) return rc;
  }
  p->cfg.train.batch = p->share;
  p->cfg.execution.micro_batch = p->mb;
  p->cfg.execution.replicas = 1;
  p->inner = pb   ? &st_exec_pipelined_backprop
             : bs ? &st_exec_block_sequential
                  : &st_exec_pipeline;
  if (!st_dist_threads_ok())
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: execution.placement: ranks needs an MPI "
                        "library that lets threads call it at once "
                        "(MPI_THREAD_MULTIPLE); this one does not",
                        st_config_where(cfg, "execution.placement"));
  /* from here a failure may be this rank's alone */
  st_dist_unshare_error();
  /* the collectives first: a failure below may be one rank's alone */
  rc = st_dist_group_create(&p->pipeline, p->replica, p->rank % p->P, err);
  if (!rc && p->R > 1)
    rc = st_dist_group_create(&p->peers, p->rank % p->P, p->replica, err);
  if (!rc) rc = st_dist_group_create(&p->xfer, p->replica, p->rank % p->P, err);
  st_placement pl = {p->pipeline, p->cfg.train.threads};
  if (!rc)
    rc = pb ? st_pb_create_placed(&p->state, m, &p->cfg, p->mb, max_batch, &pl,
                                  err)
            : st_pipeline_create_placed(&p->state, m, &p->cfg, p->mb, max_batch,
                                        bs, &pl, err);
  if (!rc && !(p->first = malloc((size_t)m->n_blocks * 3 * sizeof(int))))
    rc = st_error_set(err, ST_ENOMEM, "out of memory");
  if (!rc) {
    p->count = p->first + m->n_blocks;
    p->owner = p->first + 2 * m->n_blocks;
    p->S = pb ? st_pb_layout(p->state, p->first, p->count, p->owner)
              : st_pipeline_layout(p->state, p->first, p->count, p->owner);
    p->last_owner = p->owner[p->S - 1];
    if (m->n_ties && tie_crosses(p))
      rc = st_error_set(err, ST_ECONFIG,
                        "%s: model.tied: the head and the token embedding "
                        "share weights but land on different ranks "
                        "(execution.placement: ranks); set model.tied: "
                        "false or use placement: threads",
                        st_config_where(cfg, "model.tied"));
  }
  size_t most = 0; /* the largest stage: the exchange's scratch */
  for (int s = 0; !rc && s < p->S; s++) {
    size_t off, n;
    stage_range(p, s, &off, &n);
    if (n > most) most = n;
  }
  if (!rc && p->R > 1 && cfg->execution.deterministic &&
      !(p->scratch =
            st_alloc(st_dist_sum_scratch_in(p->peers, most) * sizeof(float))))
    rc =
        st_error_set(err, ST_ENOMEM, "out of memory for the gradient exchange");
  if (!rc) rc = eval_create(p, m, max_batch, err);
  return rc;
}

/* Why mpirun's W ranks cannot be W data-parallel replicas of this config,
 * in the terms the user set: the rank count, not execution.replicas (which
 * st_replicas_split's own message names, though the user may not have). */
static int rank_split_error(const st_config *cfg, int W, int micro_batch,
                            st_error *err) {
  const char *mode = cfg->execution.mode;
  if (strcmp(mode, "sequential") && strcmp(mode, "pipeline"))
    return st_error_set(err, ST_ECONFIG,
                        "%s: execution.mode: mpirun started %d ranks, which "
                        "run %s as data-parallel replicas only in the "
                        "sequential and pipeline modes; set "
                        "execution.placement: ranks to place its stages on "
                        "them, or start one process",
                        st_config_where(cfg, "execution.mode"), W, mode);
  char mb[64] = "";
  if (micro_batch < cfg->train.batch)
    snprintf(mb, sizeof mb, ", in whole micro-batches of %d", micro_batch);
  return st_error_set(err, ST_ECONFIG,
                      "%s: train.batch: %d does not split evenly over the %d "
                      "ranks mpirun started (one replica each%s); use a "
                      "batch that does, or another number of ranks",
                      st_config_where(cfg, "train.batch"), cfg->train.batch, W,
                      mb);
}

static int ranks_create(void **state, const st_model *m, const st_config *cfg,
                        int micro_batch, int max_batch, st_error *err) {
  *state = NULL;
  /* The errors here come from the config, which every rank shares (the
   * trainer checked): each rank finds the same one. */
  st_dist_share_error();
  const int W = st_dist_size();
  const int placed = !strcmp(cfg->execution.placement, "ranks");
  if (!placed && cfg->execution.replicas != 1 && cfg->execution.replicas != W)
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
  if (placed && !strcmp(cfg->execution.block_costs, "measured"))
    return st_error_set(err, ST_EUNSUPPORTED,
                        "%s: execution.block_costs: measured times the "
                        "blocks on each rank, and ranks that timed them "
                        "differently would cut different stages; use model "
                        "with execution.placement: ranks",
                        st_config_where(cfg, "execution.block_costs"));
  st_config world = *cfg; /* the replicas: the ranks */
  world.execution.replicas = W;
  const st_executor *inner = NULL;
  int share = 0, mb = 0, rc;
  st_error why = {0};
  if (!placed &&
      (rc = st_replicas_split(&world, micro_batch, &inner, &share, &mb, &why)))
    return rank_split_error(cfg, W, micro_batch, err);
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
  if (placed) {
    p->placed = 1;
    rc = placed_create(p, m, cfg, micro_batch, max_batch, err);
  } else {
    /* from here a failure may be this rank's alone (memory, threads):
     * every rank learns of it, so none waits in the first step's
     * exchange */
    st_dist_unshare_error();
    rc = inner->create(&p->state, m, &p->cfg, mb, max_batch, err);
    if (!rc && cfg->execution.deterministic &&
        !(p->scratch =
              st_alloc(st_dist_sum_scratch(m->n_params) * sizeof(float))))
      rc = st_error_set(err, ST_ENOMEM,
                        "out of memory for the gradient exchange");
  }
  rc = st_dist_agree(rc, err);
  if (rc) {
    ranks_destroy(p);
    return rc;
  }
  *state = p;
  return 0;
}

/* Over a grid: the stages of this rank, their gradients summed over the
 * replicas (replica order, or the library's), then updated. */
static int grid_update(ranks *p, st_trainer_view *v, st_error *err) {
  int me = p->rank % p->P, rc = 0;
  double t0 = st_now();
  for (int s = 0; !rc && s < p->S; s++) {
    if (p->owner[s] != me) continue;
    size_t off, n;
    stage_range(p, s, &off, &n);
    rc = p->cfg.execution.deterministic
             ? st_dist_sum_in(p->peers, v->grads + off, n, p->scratch, err)
             : st_dist_allreduce_in(p->peers, v->grads + off, n, err);
  }
  if (v->trace)
    st_trace_add(v->trace, v->track, ST_TRACE_REDUCE, v->step, -1, t0,
                 st_now());
  t0 = st_now();
  for (int s = 0; !rc && s < p->S; s++)
    if (p->owner[s] == me)
      st_trainer_update_blocks(v, p->first[s], p->count[s]);
  if (v->trace && !rc)
    st_trace_add(v->trace, v->track, ST_TRACE_UPDATE, v->step, -1, t0,
                 st_now());
  return rc;
}

static int placed_step(ranks *p, st_trainer_view *v, double *loss,
                       st_error *err) {
  const st_model *m = p->model;
  double start = st_now(), inner_loss;
  st_trainer_view w = *v;
  if (p->R > 1) st_replica_view(&w, v, m, p->replica, p->share, p->mb);
  int rc = p->inner->step(p->state, &w, &inner_loss, err);
  /* An error of this rank's own (a failed message): stages on other ranks
   * may wait for this one's forever, so it is not shared but ends the job
   * (the caller aborts it). A non-finite loss is found at a last stage
   * and stops the others before their updates: agreed on. */
  if (rc && rc != ST_ENONFINITE && rc != ST_EXEC_PEER_STOPPED) {
    st_dist_unshare_error();
    p->busy += st_now() - start;
    return rc;
  }
  /* a rank stopped by another learns the cause from the one that found it */
  int stopped = rc == ST_EXEC_PEER_STOPPED;
  rc = st_dist_agree(stopped ? 0 : rc, err);
  if (!rc && stopped)
    rc = st_error_set(err, ST_EIO,
                      "rank %d: internal error: the step was stopped by "
                      "another rank, which reported no error",
                      p->rank);
  /* the losses: from the last stage to its pipeline, then (a grid) from
   * every replica to all */
  size_t bytes = (size_t)p->share * m->label_rows * sizeof(float);
  if (!rc) rc = st_dist_bcast(p->pipeline, w.losses, bytes, p->last_owner, err);
  if (!rc && p->R > 1)
    rc = st_dist_group_allgather(p->peers, v->losses, bytes, err);
  if (!rc && (rc = st_trainer_check_loss(v, loss, err)))
    st_dist_share_error(); /* every rank checked the same losses */
  if (!rc && p->R > 1) rc = grid_update(p, v, err);
  p->busy += st_now() - start;
  return rc;
}

static int ranks_owns(void *state, unsigned char *mine) {
  ranks *p = state;
  if (!p->placed) return 0;
  int me = p->rank % p->P;
  memset(mine, 0, (size_t)p->model->n_blocks);
  for (int s = 0; s < p->S; s++)
    if (p->owner[s] == me) memset(mine + p->first[s], 1, (size_t)p->count[s]);
  return 1;
}

/* Blocking point-to-point on the evaluation and checkpoint communicator,
 * in messages of at most 1 GiB (an MPI count is an int). */
static int xfer(ranks *p, int send, void *buf, size_t bytes, int peer, int tag,
                st_error *err) {
  const size_t most = (size_t)1 << 30;
  size_t at = 0;
  int rc;
  do {
    size_t n = bytes - at < most ? bytes - at : most;
    st_dist_req r;
    rc = send ? st_dist_isend(p->xfer, 0, (char *)buf + at, n, peer, tag, &r,
                              err)
              : st_dist_irecv(p->xfer, 0, (char *)buf + at, n, peer, tag, &r,
                              err);
    if (!rc) rc = st_dist_wait(&r, NULL, NULL, err);
    at += n;
  } while (!rc && at < bytes);
  return rc;
}

/* The test batch through the stages, rank to rank in stage order; the
 * last stage's logits broadcast to the pipeline. NULL if a message
 * failed. */
static const float *placed_forward(ranks *p, const st_ctx *ctx,
                                   const float *params, const float *x, int B) {
  const st_model *m = p->model;
  int me = p->rank % p->P;
  st_error err = {0};
  const float *in = x;
  for (int s = 0; s < p->S; s++) {
    if (p->owner[s] != me) {
      in = NULL;
      continue;
    }
    if (!in) { /* from the rank of stage s - 1 */
      size_t n = (size_t)B * st_shape_numel(m->blocks[p->first[s]].in);
      if (xfer(p, 0, p->eval_in, n * sizeof(float), p->owner[s - 1], s, &err))
        return NULL;
      in = p->eval_in;
    }
    in = st_stage_forward(p->eval[s], ctx, params, in, B);
    int last = p->first[s] + p->count[s] - 1;
    size_t n = (size_t)B * st_shape_numel(m->blocks[last].out);
    if (s + 1 < p->S && p->owner[s + 1] != me &&
        xfer(p, 1, (void *)in, n * sizeof(float), p->owner[s + 1], s + 1, &err))
      return NULL;
  }
  size_t bytes = (size_t)B * m->label_rows * m->out_cols * sizeof(float);
  if (me == p->last_owner) memcpy(p->logits, in, bytes);
  if (st_dist_bcast(p->xfer, p->logits, bytes, p->last_owner, &err))
    return NULL;
  return p->logits;
}

/* A checkpoint's tensors: rank 0 writes, the other ranks of the first
 * replica send it their stages' tensors in the file's order. */
typedef struct saving {
  ranks *p;
  const float *params, *opt;
  int fetched; /* tensors fetched so far (rank 0) */
} saving;

static const float *at_slab(const saving *sv, int slot, size_t off) {
  return slot < 0 ? sv->params + off
                  : sv->opt + (size_t)slot * sv->p->model->n_params + off;
}

static const float *fetch(void *arg, int slot, size_t off, size_t numel,
                          st_error *err) {
  saving *sv = arg;
  int owner = sv->p->owner[stage_at(sv->p, off)];
  sv->fetched++;
  if (owner == 0) return at_slab(sv, slot, off);
  return xfer(sv->p, 0, sv->p->tensor, numel * sizeof(float), owner, 0, err)
             ? NULL
             : sv->p->tensor;
}

/* Rank 0 after a save that failed before it fetched every tensor: the
 * rest are taken and dropped, so no rank is left sending. */
static int drain_rest(void *arg, int slot, size_t off, size_t numel,
                      st_error *err) {
  (void)slot;
  saving *sv = arg;
  int owner = sv->p->owner[stage_at(sv->p, off)];
  if (sv->fetched-- > 0 || owner == 0) return 0;
  st_error ignored = {0};
  xfer(sv->p, 0, sv->p->tensor, numel * sizeof(float), owner, 0, &ignored);
  (void)err;
  return 0;
}

static int send_own(void *arg, int slot, size_t off, size_t numel,
                    st_error *err) {
  saving *sv = arg;
  if (sv->p->owner[stage_at(sv->p, off)] != sv->p->rank % sv->p->P) return 0;
  return xfer(sv->p, 1, (void *)at_slab(sv, slot, off), numel * sizeof(float),
              0, 0, err);
}

/* Shards: each rank of the first replica writes its own stages' tensors
 * into the directory rank 0 names, then rank 0 the index. */
static int save_shards(ranks *p, const char *path, const float *params,
                       const float *opt, const char *optim_kind,
                       const st_train_pos *pos, st_error *err) {
  const st_model *m = p->model;
  char dir[ST_PATH_MAX] = "", shard[ST_PATH_MAX + 64], name[64];
  int me = p->rank % p->P, rc = 0;
  unsigned char *mine = malloc((size_t)m->n_blocks);
  int *shard_of = malloc((size_t)m->n_blocks * sizeof *shard_of);
  if (!mine || !shard_of) rc = st_error_set(err, ST_ENOMEM, "out of memory");
  if (p->rank == 0) snprintf(dir, sizeof dir, "%s", path);
  if (p->replica == 0) {
    st_error e = {0};
    int sent = st_dist_bcast(p->xfer, dir, sizeof dir, 0, &e);
    if (!rc && sent) rc = sent, *err = e;
    if (!rc) rc = st_mkdir_p(dir, 1, err);
    if (!rc) {
      ranks_owns(p, mine);
      st_checkpoint_shard_name(name, sizeof name, me, p->P);
      snprintf(shard, sizeof shard, "%s/%s", dir, name);
      rc = st_checkpoint_save_shard(shard, m, params, opt, optim_kind, pos,
                                    mine, err);
    }
  }
  rc = st_dist_agree(rc, err); /* every shard whole before the index */
  if (!rc && p->rank == 0) {
    for (int s = 0; s < p->S; s++)
      for (int b = p->first[s]; b < p->first[s] + p->count[s]; b++)
        shard_of[b] = p->owner[s];
    rc =
        st_checkpoint_write_index(dir, m, optim_kind, shard_of, p->P, pos, err);
  }
  free(mine);
  free(shard_of);
  return st_dist_agree(rc, err);
}

static int ranks_save(void *state, const char *path, int shards,
                      const float *params, const float *opt,
                      const char *optim_kind, const st_train_pos *pos,
                      st_error *err) {
  ranks *p = state;
  saving sv = {p, params, opt, 0};
  int rc = 0;
  st_dist_unshare_error();
  if (shards) return save_shards(p, path, params, opt, optim_kind, pos, err);
  if (p->rank == 0) {
    rc = st_checkpoint_save_fetch(path, p->model, optim_kind, pos, fetch, &sv,
                                  err);
    /* failed before its last fetch (a file it could not open, memory):
     * the other ranks' tensors are taken all the same */
    st_error ignored = {0};
    if (rc) st_checkpoint_each(p->model, optim_kind, drain_rest, &sv, &ignored);
  } else if (p->replica == 0) /* the other replicas hold the same */
    rc = st_checkpoint_each(p->model, optim_kind, send_own, &sv, err);
  return st_dist_agree(rc, err);
}

static int ranks_finish(void *state, st_error *err) {
  ranks *p = state;
  return p->placed && p->inner == &st_exec_pipelined_backprop
             ? st_pb_close_links(p->state, err)
             : 0;
}

static int ranks_step(void *state, st_trainer_view *v, double *loss,
                      st_error *err) {
  ranks *p = state;
  if (p->placed) return placed_step(p, v, loss, err);
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
  if (p->placed) return placed_forward(p, ctx, params, x, B);
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
  for (int i = 0; i < n && i < cap; i++)
    out[i].bound_s = 0; /* the inner mode's timeline, not this wall's */
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
    .owns = ranks_owns,
    .save = ranks_save,
    .finish = ranks_finish,
};
