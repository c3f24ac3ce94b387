/* SPDX-License-Identifier: Apache-2.0 */
/* The peer tier's public calls: argument checks, then core/peer.c. */
#include "api.h"
#include "peer.h"

/* Less than this is not worth a tier: a link's bookkeeping and a lender's reservation. */
#define MIN_LEND ((uint64_t)1 << 20)

static int check_pair(spw_runtime_t *lender, spw_runtime_t *borrower) {
  if (!lender || !borrower || lender == borrower) return SPW_ERR_INVALID_ARG;
  if (spw__in_callback(lender) || spw__in_callback(borrower)) return SPW_ERR_WOULD_DEADLOCK;
  return SPW_OK;
}

int spw_peer_lend(spw_runtime_t *lender, spw_runtime_t *borrower, uint64_t bytes) {
  int st = check_pair(lender, borrower);
  if (st != SPW_OK) return st;
  if (lender->kind != borrower->kind)
    return spw__set_error(borrower, SPW_ERR_INVALID_ARG,
                          "lender and borrower run on different backends (cuda and host)");
  if (bytes < MIN_LEND || bytes > lender->budget.limit || bytes > SIZE_MAX / 2)
    return spw__set_error(lender, SPW_ERR_INVALID_ARG,
                          "%llu bytes to lend: at least 1 MiB and at most the lender's device "
                          "limit (%llu bytes)",
                          (unsigned long long)bytes, (unsigned long long)lender->budget.limit);
  return spw__peer_lend(lender, borrower, bytes - bytes % SPW_ARENA_ALIGN);
}

int spw_peer_reclaim(spw_runtime_t *lender, spw_runtime_t *borrower) {
  int st = check_pair(lender, borrower);
  return st == SPW_OK ? spw__peer_reclaim(lender, borrower) : st;
}
