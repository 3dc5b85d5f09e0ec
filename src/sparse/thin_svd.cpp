#include "sparse/thin_svd.h"

#include <algorithm>

#include "base/check.h"

extern "C" void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda, double* s, double* u,
                        const int* ldu, double* vt, const int* ldvt, double* work, const int* lwork, int* iwork,
                        int* info);

namespace se {

ThinSvd thin_svd(std::span<const double> a, int32_t rows, int32_t cols) {
  SE_CHECK(rows > 0 && cols > 0 && a.size() == static_cast<size_t>(rows) * static_cast<size_t>(cols),
           "thin_svd: {} values for a {} x {} matrix", a.size(), rows, cols);
  // Row-major A [rows, cols] is column-major A^T [cols, rows] = V S U^T: LAPACK's column-major u [cols, k] is our
  // row-major Vt [k, cols], and its vt [k, rows] our row-major U [rows, k], element for element.
  const int m = cols, n = rows, k = std::min(rows, cols);
  std::vector<double> work_a(a.begin(), a.end());
  ThinSvd svd;
  svd.k = k;
  svd.sigma.resize(static_cast<size_t>(k));
  svd.vt.resize(static_cast<size_t>(k) * static_cast<size_t>(cols));
  svd.u.resize(static_cast<size_t>(rows) * static_cast<size_t>(k));
  std::vector<int> iwork(static_cast<size_t>(8) * static_cast<size_t>(k));
  int lwork = -1, info = 0;
  double query = 0;
  dgesdd_("S", &m, &n, work_a.data(), &m, svd.sigma.data(), svd.vt.data(), &m, svd.u.data(), &k, &query, &lwork,
          iwork.data(), &info);
  SE_CHECK(info == 0, "dgesdd workspace query failed: info {}", info);
  lwork = static_cast<int>(query);
  std::vector<double> work(static_cast<size_t>(lwork));
  dgesdd_("S", &m, &n, work_a.data(), &m, svd.sigma.data(), svd.vt.data(), &m, svd.u.data(), &k, work.data(), &lwork,
          iwork.data(), &info);
  SE_CHECK(info == 0, "dgesdd failed: info {}", info);
  return svd;
}

}  // namespace se
