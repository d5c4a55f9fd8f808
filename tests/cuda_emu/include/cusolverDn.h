#pragma once
// cuSOLVER's dense Cholesky as the device GPTQ uses it (kernels/cuda/gptq_device.cpp): lower
// factor of a column-major matrix, *info = the first non-positive pivot (1-based) or 0.
#include "emu.h"

typedef struct cusolverDnContext* cusolverDnHandle_t;
typedef enum { CUSOLVER_STATUS_SUCCESS = 0 } cusolverStatus_t;
inline cusolverStatus_t cusolverDnCreate(cusolverDnHandle_t* h) {
  *h = reinterpret_cast<cusolverDnHandle_t>(uintptr_t(0x30));
  return CUSOLVER_STATUS_SUCCESS;
}
inline cusolverStatus_t cusolverDnDestroy(cusolverDnHandle_t) { return CUSOLVER_STATUS_SUCCESS; }
inline cusolverStatus_t cusolverDnSetStream(cusolverDnHandle_t, cudaStream_t) { return CUSOLVER_STATUS_SUCCESS; }
inline cusolverStatus_t cusolverDnDpotrf_bufferSize(cusolverDnHandle_t, cublasFillMode_t, int, double*, int, int* lwork) {
  *lwork = 1;
  return CUSOLVER_STATUS_SUCCESS;
}
inline cusolverStatus_t cusolverDnDpotrf(cusolverDnHandle_t, cublasFillMode_t uplo, int n, double* A, int lda, double*,
                                         int, int* info) {
  if (uplo != CUBLAS_FILL_MODE_LOWER) emu::unsupported("cusolverDnDpotrf of the upper triangle");
  *info = 0;
  for (int j = 0; j < n; ++j) {
    double d = A[j + size_t(j) * lda];
    for (int k = 0; k < j; ++k) d -= A[j + size_t(k) * lda] * A[j + size_t(k) * lda];
    if (!(d > 0) || !std::isfinite(d)) {
      *info = j + 1;
      return CUSOLVER_STATUS_SUCCESS;
    }
    d = std::sqrt(d);
    A[j + size_t(j) * lda] = d;
    for (int i = j + 1; i < n; ++i) {
      double s = A[i + size_t(j) * lda];
      for (int k = 0; k < j; ++k) s -= A[i + size_t(k) * lda] * A[j + size_t(k) * lda];
      A[i + size_t(j) * lda] = s / d;
    }
  }
  return CUSOLVER_STATUS_SUCCESS;
}
