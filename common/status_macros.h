// Status propagation helpers for absl::Status / absl::StatusOr (STYLE.md 1).
//
//   DI_RETURN_IF_ERROR(DoThing());            // returns the Status if not OK
//   DI_ASSIGN_OR_RETURN(auto x, MakeThing()); // x = value, or returns the Status
//
// Both work in functions returning absl::Status or absl::StatusOr<T>.
#ifndef DEEPINFER_COMMON_STATUS_MACROS_H_
#define DEEPINFER_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DI_STATUS_CONCAT_INNER_(a, b) a##b
#define DI_STATUS_CONCAT_(a, b) DI_STATUS_CONCAT_INNER_(a, b)

#define DI_RETURN_IF_ERROR(expr)                                 \
  do {                                                           \
    ::absl::Status di_status_ = (expr);                          \
    if (!di_status_.ok()) return di_status_;                     \
  } while (false)

#define DI_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                              \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#define DI_ASSIGN_OR_RETURN(lhs, expr) \
  DI_ASSIGN_OR_RETURN_IMPL_(DI_STATUS_CONCAT_(di_statusor_, __LINE__), lhs, expr)

#endif  // DEEPINFER_COMMON_STATUS_MACROS_H_
