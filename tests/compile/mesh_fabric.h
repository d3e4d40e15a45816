/*
 * mesh_fabric.h — a w x h mesh for the compiler's tests (test_compile,
 * test_mesh): 2.2 GFLOP/s a PE, pe_memory bytes each, links of `link`
 * bytes/s; the mesh model's other terms (hops, per-PE overhead, I/O) off
 * unless a test sets them.
 */
#ifndef STRATA_TESTS_MESH_FABRIC_H
#define STRATA_TESTS_MESH_FABRIC_H

#include "strata.h"

#include <stdio.h>
#include <string.h>

static inline st_fabric test_mesh_fabric(int w, int h, double pe_memory,
                                         double link) {
  st_fabric f;
  memset(&f, 0, sizeof f);
  f.kind = ST_FABRIC_MESH;
  snprintf(f.name, sizeof f.name, "mesh:%dx%d", w, h);
  f.width = w;
  f.height = h;
  f.pes = (int64_t)w * h;
  f.pe_flops = 2.2e9;
  f.pe_memory = pe_memory;
  f.link_bandwidth = link;
  return f;
}

#endif
