// Thread block clusters are not emulated (blocks run one at a time): the emulated device reports
// compute capability 8.0 so that the backend never launches a cluster kernel; these stand-ins only
// let paged_attention.cu compile, and abort if reached.
#pragma once
#include "emu.h"

namespace cooperative_groups {
struct cluster_group {
  void sync() const { ::emu::unsupported("cluster.sync"); }
  template <class T>
  T* map_shared_rank(T* p, int) const {
    ::emu::unsupported("cluster.map_shared_rank");
    return p;
  }
};
inline cluster_group this_cluster() {
  ::emu::unsupported("this_cluster");
  return {};
}
}  // namespace cooperative_groups
