/*
 * choose.c — `strata compile`'s choice of execution mode and micro-batch
 * (docs/compiler.md, "Choosing the mode").
 *
 * The mode is chosen by memory, as the seeds choose it on the wafer: the
 * modes that could run the model are tried in order, and the first whose
 * plan fits the fabric is the plan.
 *   mesh, wse2  layer-pipelined (the config's pipeline or pipelined_backprop,
 *               else a pipeline on its schedule; none with
 *               metrics.noise_scale, which no pipeline measures), then
 *               weight streaming as the config sets keep_activations, then
 *               the other way
 *   cpu         the config's own mode, then weight streaming as the config
 *               sets it (its store and keep_activations), then a memory
 *               store, a file store keeping the activations, one
 *               recomputing them
 * Weight streaming asked for (the config's mode, or --mode) and fitting as
 * the config sets it is planned so: what `strata train` runs. Otherwise the
 * fastest of the variants that fit is.
 * With execution.micro_batch 0 the compiler picks it: for a pipeline, the
 * smallest micro-batch whose predicted rate is within 5% of the best (the
 * bubble shrinks as micro-batches get smaller, GEMMs slow down); for the
 * other modes the whole batch if it fits, else the largest part of it that
 * does. A forced mode (--mode) is planned alone and set against the chosen
 * one; refused, it names the mode that would fit, if one does. Nothing fitting
 * is one error naming each mode's shortfall and the smallest fabric of the kind
 * that would hold the model.
 */
#include "exec.h"

#include "../compile/compile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Predicted rate within which a smaller micro-batch is preferred. */
#define MICRO_BATCH_SLACK 0.05

typedef struct candidate {
  char mode[24];
  int keep; /* weight streaming: keep the activations */
  char store[8];
  /* weight streaming as the config sets it (its keep_activations and
   * store): when the config's mode, or --mode, is weight streaming, what
   * `strata train` runs, so planned as it is and not swapped for a faster
   * variant (those are tried only when it does not fit) */
  int own;
} candidate;

static int is_ws(const char *mode) { return !strcmp(mode, "weight_streaming"); }

static double rate_of(const st_plan *p) {
  return st_plan_rate(p, !strcmp(p->mode, "pipelined_backprop"));
}

static double plan_bytes(const st_plan *p) {
  double b = 0;
  for (int s = 0; s < p->n_stages; s++) b += p->stages[s].mem_total;
  return b;
}

static void apply(st_config *c, const candidate *k, int mb) {
  snprintf(c->execution.mode, sizeof c->execution.mode, "%s", k->mode);
  c->execution.micro_batch = mb;
  if (is_ws(k->mode)) {
    c->execution.replicas = 1; /* replicas run sequential and pipeline */
    c->execution.keep_activations = k->keep;
    if (k->store[0])
      snprintf(c->execution.store, sizeof c->execution.store, "%s", k->store);
  }
}

/* Whether micro-batches of mb (applied as apply() sets them) are a
 * config `strata train` runs: a divisor of the batch and, with replicas
 * (weight streaming drops them), of each replica's share of it. */
static int splits(const st_config *cfg, const candidate *k, int mb,
                  int applied) {
  const int batch = cfg->train.batch;
  int R = is_ws(k->mode) ? 1 : cfg->execution.replicas;
  return batch % mb == 0 && (applied == 0 || R <= 1 || batch % (R * mb) == 0);
}

/* One candidate at the micro-batch the compiler picks (or the config's);
 * *why says how it was picked. The last failure's message stays in err. */
static int plan_candidate(st_plan **out, const st_config *cfg,
                          const candidate *k, int stages, char *why, size_t cap,
                          st_config *applied, st_error *err) {
  st_config c = *cfg;
  const int batch = cfg->train.batch;
  why[0] = '\0';
  int pb = !strcmp(k->mode, "pipelined_backprop");
  if (cfg->execution.micro_batch > 0 || pb) {
    apply(&c, k, cfg->execution.micro_batch);
    *applied = c;
    return st_plan_compile(out, &c, stages, err);
  }
  if (strcmp(k->mode, "pipeline") != 0) {
    /* the whole batch if it fits, else the largest part of it that does */
    int rc = ST_EUNSUPPORTED;
    for (int mb = batch; mb >= 1; mb--) {
      if (!splits(cfg, k, mb, mb == batch ? 0 : mb)) continue;
      apply(&c, k, mb == batch ? 0 : mb);
      st_error e = {0};
      rc = st_plan_compile(out, &c, stages, &e);
      if (!rc) {
        *applied = c;
        if (mb < batch)
          snprintf(why, cap,
                   "; micro-batches of %d, the largest part of the batch of "
                   "%d that fits (execution.micro_batch=%d)",
                   mb, batch, mb);
        return 0;
      }
      *err = e; /* the last tried: the smallest micro-batch's shortfall */
      if (rc != ST_EUNSUPPORTED) return rc;
    }
    return rc;
  }
  /* a pipeline: every divisor, the smallest within the slack of the best;
   * a micro-batch that does not fit, nor does any larger one */
  double best = 0, rates[64];
  int best_mb = 0, n = 0, mbs[64];
  for (int mb = 1; mb <= batch && n < 64; mb++) {
    if (!splits(cfg, k, mb, mb)) continue;
    st_plan *p;
    st_error e = {0};
    apply(&c, k, mb);
    int rc = st_plan_compile(&p, &c, stages, &e);
    if (rc) {
      if (!n || rc != ST_EUNSUPPORTED) {
        *err = e;
        return rc;
      }
      break;
    }
    mbs[n] = mb;
    rates[n++] = rate_of(p);
    if (rate_of(p) > best) best = rate_of(p), best_mb = mb;
    st_plan_destroy(p);
  }
  int pick = best_mb;
  for (int i = 0; i < n; i++)
    if (rates[i] >= best * (1 - MICRO_BATCH_SLACK)) {
      pick = mbs[i];
      break;
    }
  apply(&c, k, pick);
  *applied = c;
  int rc = st_plan_compile(out, &c, stages, err);
  if (!rc) {
    char a[32], b[32];
    snprintf(why, cap,
             "; micro-batches of %d (execution.micro_batch=%d): the smallest "
             "whose predicted rate, %s samples/s, is within %.0f%% of the best "
             "(%s at %d)",
             pick, pick, st_plan_fmt_rate(a, sizeof a, rate_of(*out)),
             100 * MICRO_BATCH_SLACK, st_plan_fmt_rate(b, sizeof b, best),
             best_mb);
  }
  return rc;
}

/* The modes to try, in order; returns their count. Stages asked for
 * (--stages) are a pipeline's: then only the config's own mode (or a
 * layer-pipelined one on a mesh). Weight streaming is tried first as the
 * config sets it (keep_activations, store), then its other variants. */
static int candidates(const st_config *cfg, const st_fabric *f, int stages,
                      candidate *out) {
  int n = 0;
  const char *mode = cfg->execution.mode;
  if (stages > 0 && !is_ws(mode)) {
    int pipelined =
        !strcmp(mode, "pipeline") || !strcmp(mode, "pipelined_backprop");
    snprintf(out[n++].mode, sizeof out->mode, "%s",
             f->kind == ST_FABRIC_MESH && !pipelined ? "pipeline" : mode);
    return n;
  }
  candidate own = {"weight_streaming", cfg->execution.keep_activations, "", 1};
  if (f->kind == ST_FABRIC_MESH) {
    /* a pipeline does not measure the noise scale (st_config_validate) */
    if (!is_ws(mode) && !cfg->metrics.noise_scale) {
      int pipelined =
          !strcmp(mode, "pipeline") || !strcmp(mode, "pipelined_backprop");
      snprintf(out[n].mode, sizeof out->mode, "%s",
               pipelined ? mode : "pipeline");
      out[n++].own = 0;
    }
    /* a store beside it: the config's, whatever its kind */
    out[n++] = own;
    candidate other = own;
    other.keep = !own.keep;
    other.own = 0;
    out[n++] = other;
    return n;
  }
  if (!is_ws(mode)) {
    snprintf(out[n].mode, sizeof out->mode, "%s", mode);
    out[n++].own = 0;
  }
  snprintf(own.store, sizeof own.store, "%s", cfg->execution.store);
  out[n++] = own;
  const candidate more[] = {{"weight_streaming", 1, "memory", 0},
                            {"weight_streaming", 1, "file", 0},
                            {"weight_streaming", 0, "file", 0}};
  for (int i = 0; i < 3; i++)
    if (more[i].keep != own.keep || strcmp(more[i].store, own.store))
      out[n++] = more[i];
  return n;
}

/* Weight streaming's variant: "file store, keeping activations". */
static const char *ws_variant(char *buf, size_t cap, const candidate *k) {
  snprintf(buf, cap, "%s%s%s", k->store, k->store[0] ? " store, " : "",
           k->keep ? "keeping activations" : "recomputing each block");
  return buf;
}

static const char *candidate_name(char *buf, size_t cap, const candidate *k,
                                  const st_config *cfg) {
  char v[48];
  if (is_ws(k->mode))
    snprintf(buf, cap, "weight streaming (%s)", ws_variant(v, sizeof v, k));
  else if (!strcmp(k->mode, "pipeline"))
    snprintf(buf, cap, "pipeline (%.16s)", cfg->execution.schedule);
  else
    snprintf(buf, cap, "%.23s", k->mode);
  return buf;
}

/* "the smallest cpu / mesh that would hold it": weight streaming at one
 * sample, recomputing, from a store beside it. */
static void smallest_fabric(char *buf, size_t cap, const st_config *cfg,
                            const st_fabric *f) {
  buf[0] = '\0';
  st_model *m;
  st_error e = {0};
  if (st_plan_model(&m, cfg, &e)) return;
  st_block_cost *costs = st_alloc((size_t)m->n_blocks * sizeof *costs);
  if (costs) {
    st_plan_costs(costs, m, cfg);
    double need = st_plan_streaming_need(costs, m->n_blocks, 1,
                                         cfg->execution.prefetch + 1, 0, 0);
    char a[32], b[32], c[32];
    if (f->kind == ST_FABRIC_CPU) {
      snprintf(buf, cap,
               "the smallest cpu that would hold it has %s of memory (this "
               "one %s), by weight streaming from a file store recomputing "
               "each block",
               st_plan_fmt_bytes(a, sizeof a, need),
               st_plan_fmt_bytes(b, sizeof b, (double)f->pes * f->pe_memory));
    } else {
      double pes = ceil(need / f->pe_memory);
      int side = (int)ceil(sqrt(pes));
      snprintf(
          buf, cap,
          "the smallest square mesh of these PEs that would hold it is "
          "mesh:%dx%d (%s PEs, %s), by weight streaming recomputing each "
          "block",
          side, side, st_plan_fmt_count(a, sizeof a, (double)side * side),
          st_plan_fmt_bytes(c, sizeof c, (double)side * side * f->pe_memory));
    }
  }
  st_free(costs);
  st_model_destroy(m);
}

/* Tries the candidates in order (only `force`'s when given): the first
 * plan that fits; *tried lists the failures before it. */
static int first_fit(st_plan **out, const st_config *cfg, const st_fabric *f,
                     int stages, const char *force, char *tried, size_t cap,
                     char *pick_why, size_t pick_cap, int *chosen,
                     st_config *applied, st_error *err) {
  candidate k[8];
  int n = candidates(cfg, f, stages, k), rc = ST_EUNSUPPORTED, any = 0;
  size_t used = 0;
  tried[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (force && strcmp(k[i].mode, force) != 0) continue;
    any = 1;
    st_error e = {0};
    rc = plan_candidate(out, cfg, &k[i], stages, pick_why, pick_cap, applied,
                        &e);
    if (!rc) {
      *chosen = i;
      /* weight streaming's variants that fit too: the fastest, unless the
       * config (or --mode) asks for weight streaming and its own fits */
      int asked = is_ws(cfg->execution.mode) || (force && is_ws(force));
      for (int j = i + 1; is_ws(k[i].mode) && !(asked && k[i].own) && j < n;
           j++) {
        st_plan *other;
        char other_why[ST_CAUSE_MAX];
        st_config other_cfg;
        st_error e2 = {0};
        if (!is_ws(k[j].mode) ||
            plan_candidate(&other, cfg, &k[j], stages, other_why,
                           sizeof other_why, &other_cfg, &e2))
          continue;
        if (rate_of(other) > rate_of(*out) * (1 + 1e-9)) {
          st_plan_destroy(*out);
          *out = other;
          *chosen = j;
          *applied = other_cfg;
          snprintf(pick_why, pick_cap, "%s", other_why);
        } else {
          st_plan_destroy(other);
        }
      }
      return 0;
    }
    if (rc != ST_EUNSUPPORTED) { /* a bad request, not a misfit */
      *err = e;
      return rc;
    }
    char name[96];
    candidate_name(name, sizeof name, &k[i], cfg);
    int w = snprintf(tried + used, cap - used, "%s%s: %s", used ? "; " : "",
                     name, e.msg);
    if (w > 0) used = used + (size_t)w < cap ? used + (size_t)w : cap - 1;
  }
  if (!any) { /* a forced mode the fabric has no candidate for: plan it */
    candidate one = {"", cfg->execution.keep_activations, "", 1};
    snprintf(one.mode, sizeof one.mode, "%s", force);
    snprintf(one.store, sizeof one.store, "%s", cfg->execution.store);
    rc = plan_candidate(out, cfg, &one, stages, pick_why, pick_cap, applied,
                        err);
    if (!rc) *chosen = -1;
    return rc;
  }
  return st_error_set(err, rc, "%s", tried);
}

/* The plan compile chooses without --mode (its candidate in *chosen): set
 * against a forced mode, or named when the forced one does not fit. */
static int unforced(st_plan **out, const st_config *cfg, const st_fabric *f,
                    int stages, int *chosen) {
  char tried[2048], pick[ST_CAUSE_MAX];
  st_error e = {0};
  st_config applied;
  return first_fit(out, cfg, f, stages, NULL, tried, sizeof tried, pick,
                   sizeof pick, chosen, &applied, &e);
}

int st_plan_choose(st_plan **out, const st_config *cfg, int stages,
                   const char *force, st_config *applied, st_error *err) {
  *out = NULL;
  st_config ignored;
  if (!applied) applied = &ignored;
  st_fabric f;
  int rc = st_fabric_resolve(&f, cfg, err);
  if (rc) return rc;
  char tried[2048], pick[ST_CAUSE_MAX], why[1024], name[96], a[32], b[32];
  int chosen = -1;
  candidate k[8];
  candidates(cfg, &f, stages, k);
  rc = first_fit(out, cfg, &f, stages, force, tried, sizeof tried, pick,
                 sizeof pick, &chosen, applied, err);
  if (rc) {
    if (rc == ST_EUNSUPPORTED) {
      char smallest[320] = "";
      if (force) {
        /* what fits this fabric without --mode, if anything: the way out
         * a user wants before a bigger fabric */
        st_plan *auto_plan = NULL;
        int c2 = -1;
        if (unforced(&auto_plan, cfg, &f, stages, &c2) == 0) {
          candidate_name(name, sizeof name, &k[c2], cfg);
          snprintf(smallest, sizeof smallest,
                   "without --mode it fits by %s, predicted %s samples/s", name,
                   st_plan_fmt_rate(a, sizeof a, rate_of(auto_plan)));
        }
        st_plan_destroy(auto_plan);
      }
      if (!smallest[0]) smallest_fabric(smallest, sizeof smallest, cfg, &f);
      /* the smallest fabric first: the modes' reasons may fill the line */
      char msg[sizeof err->msg];
      snprintf(msg, sizeof msg, "%s", err->msg);
      return st_error_set(err, rc, "%s %s (%s): %s",
                          force ? "the forced mode does not fit"
                                : "no mode fits",
                          f.name, smallest[0] ? smallest : "-", msg);
    }
    return rc;
  }
  st_plan *p = *out;
  if (chosen >= 0)
    candidate_name(name, sizeof name, &k[chosen], cfg);
  else
    snprintf(name, sizeof name, "%s", force);
  int w;
  char forced[96];
  if (force && is_ws(force) && chosen >= 0) { /* which variant was planned */
    char v[48];
    snprintf(forced, sizeof forced, "--mode %s, %s", force,
             ws_variant(v, sizeof v, &k[chosen]));
  } else if (force) {
    snprintf(forced, sizeof forced, "--mode %s", force);
  }
  if (force) {
    /* what forcing costs: the plan compile would choose, for comparison */
    st_plan *auto_plan = NULL;
    int c2 = -1;
    int arc = unforced(&auto_plan, cfg, &f, stages, &c2);
    if (arc == 0 &&
        fabs(rate_of(auto_plan) - rate_of(p)) > 1e-9 * rate_of(auto_plan)) {
      char other[96];
      candidate_name(other, sizeof other, &k[c2], cfg);
      w = snprintf(why, sizeof why,
                   "forced (%s): predicted %s samples/s, %.2fx the %s "
                   "samples/s of %s, the plan compile chooses",
                   forced, st_plan_fmt_rate(a, sizeof a, rate_of(p)),
                   rate_of(auto_plan) > 0 ? rate_of(p) / rate_of(auto_plan) : 0,
                   st_plan_fmt_rate(b, sizeof b, rate_of(auto_plan)), other);
    } else {
      w = snprintf(why, sizeof why, "forced (%s)%s", forced,
                   arc == 0 ? ": as fast as the plan compile chooses" : "");
    }
    st_plan_destroy(auto_plan);
  } else if (cfg->launch.ranks > 1) {
    /* no process holds the plan's sum: each rank its share, checked
     * against its machine by st_plan_place_ranks */
    w = snprintf(why, sizeof why,
                 "%s: it fits %s over %d ranks (each rank's "
                 "share below)%s",
                 name, f.name, cfg->launch.ranks, pick);
  } else {
    w = snprintf(why, sizeof why, "%s: it fits %s (%s of %s)%s", name, f.name,
                 st_plan_fmt_bytes(a, sizeof a, plan_bytes(p)),
                 st_plan_fmt_bytes(b, sizeof b, (double)f.pes * f.pe_memory),
                 pick);
    if (tried[0] && w > 0 && (size_t)w < sizeof why)
      snprintf(why + w, sizeof why - (size_t)w, "; not before it: %.*s",
               (int)(sizeof why - (size_t)w), tried);
    pick[0] = '\0';
  }
  if (w > 0 && (size_t)w < sizeof why && pick[0])
    snprintf(why + w, sizeof why - (size_t)w, "%s", pick);
  snprintf(p->mode_why, sizeof p->mode_why, "%s", why);
  return 0;
}
