/*
 * test_watch.c — the line a rank's watch prints when a wait on the others
 * lasts execution.rank_timeout (src/dist/mpi.c): st_dist_watch_verdict, a
 * pure function of the answers the watch got from the other ranks. Each
 * case is a state of a job written out by hand, with the ranks the line
 * must name and the cause it must give:
 *  - a rank that does not answer the watch at all (stopped, cut off) is
 *    named before any other, one or many (the list's "and N more" past 7);
 *  - a rank that answers but waits on no one is busy in its own work, with
 *    the longest such time;
 *  - when every rank answers from a wait, the first waiting on something
 *    else is the lead (a receive on rank 3), or, all in the same
 *    collective, the messages do not arrive;
 *  - a wait on one peer judges that peer only (another rank silent is not
 *    its cause); a wait "on" oneself (a broadcast's root) is on the others.
 * The end-to-end runs (a rank SIGSTOPped under mpirun, named in rank 0's
 * line) are in test_mpi.sh.
 */
#include "harness.h"
#include "strata.h"

#include "../../src/dist/dist.h"

enum { N = 12 };
static st_dist_told told[N];
static unsigned char answered[N];

static void reset(int size) {
  memset(told, 0, sizeof told);
  memset(answered, 0, sizeof answered);
  for (int r = 0; r < size; r++) {
    answered[r] = 1;
    told[r] = (st_dist_told){.waiting = 1, .peer = -1, .ms = 3000};
    snprintf(told[r].what, sizeof told[r].what, "the all-reduce");
  }
}

static void expect(const char *name, int me, int size, const char *what,
                   int peer, const char *who_want, const char *why_want) {
  char who[96], why[160];
  st_dist_watch_verdict(me, size, what, peer, told, answered, who, sizeof who,
                        why, sizeof why);
  CHECK(!strcmp(who, who_want), "%s: who '%s', want '%s'", name, who, who_want);
  CHECK(!strcmp(why, why_want), "%s: why '%s', want '%s'", name, why, why_want);
}

int main(void) {
  const char *stopped = "it does not answer the watch either: it is stopped "
                        "or cut off";

  reset(2);
  answered[1] = 0;
  expect("collective, one silent", 0, 2, "the all-reduce", -1, "rank 1",
         stopped);

  reset(4);
  answered[1] = answered[3] = 0;
  told[2].waiting = 0, told[2].ms = 9000; /* busy, but a silent one leads */
  expect("collective, two silent", 0, 4, "the all-reduce", -1, "ranks 1 and 3",
         "they do not answer the watch either: they are stopped or cut off");

  reset(N);
  for (int r = 1; r < N; r++) answered[r] = 0;
  expect("collective, eleven silent", 0, N, "the all-reduce", -1,
         "ranks 1, 2, 3, 4, 5, 6 and 5 more",
         "they do not answer the watch either: they are stopped or cut off");

  reset(4);
  answered[0] = 0; /* the asker itself is never named */
  told[2].waiting = 0, told[2].ms = 7400;
  expect("collective, one busy", 0, 4, "the all-reduce", -1, "rank 2",
         "it answers, and has waited on no one for 7 s: it is busy or stuck "
         "in its own work");

  reset(4);
  told[1].waiting = 0, told[1].ms = 4000;
  told[3].waiting = 0, told[3].ms = 12900;
  expect("collective, two busy", 2, 4, "the all-reduce", -1, "ranks 1 and 3",
         "they answer, and have waited on no one for up to 12 s: they are "
         "busy or stuck in their own work");

  reset(4);
  told[2].peer = 3, told[2].ms = 5100;
  snprintf(told[2].what, sizeof told[2].what, "a receive");
  expect("collective, a rank waits elsewhere", 0, 4, "the all-reduce", -1,
         "a rank",
         "every rank answers, rank 2 waiting in a receive on rank 3 for 5 s");

  reset(3);
  snprintf(told[1].what, sizeof told[1].what, "the stop check");
  expect("collective, another collective", 0, 3, "the all-reduce", -1, "a rank",
         "every rank answers, rank 1 waiting in the stop check for 3 s");

  reset(3);
  expect("collective, all in it", 1, 3, "the all-reduce", -1, "a rank",
         "every rank answers the watch and waits in it too: the messages "
         "between them do not arrive");

  reset(3);
  answered[1] = 0;
  expect("receive, the peer silent", 0, 3, "a receive", 1, "rank 1", stopped);

  reset(3);
  answered[2] = 0; /* not the peer: not this wait's cause */
  told[1].waiting = 0, told[1].ms = 2000;
  expect("receive, the peer busy", 0, 3, "a receive", 1, "rank 1",
         "it answers, and has waited on no one for 2 s: it is busy or stuck "
         "in its own work");

  reset(3);
  told[1].peer = 2;
  snprintf(told[1].what, sizeof told[1].what, "a receive");
  expect("receive, the peer waits on another", 0, 3, "a receive", 1, "rank 1",
         "it answers, waiting in a receive on rank 2 for 3 s");

  reset(2);
  snprintf(told[1].what, sizeof told[1].what, "a broadcast");
  expect("broadcast, the root in it too", 0, 2, "a broadcast", 1, "rank 1",
         "it answers the watch and waits in it too: the messages between "
         "them do not arrive");

  reset(3);
  answered[2] = 0; /* a root waits on the others, not on itself */
  expect("broadcast, the root waiting", 1, 3, "a broadcast", 1, "rank 2",
         stopped);

  TH_DONE();
}
