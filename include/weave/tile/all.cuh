// The tile substrate (layer 1): everything a Hopper kernel body needs, none of it third-party.
#pragma once
#include "weave/tile/cluster.cuh"
#include "weave/tile/fragment.cuh"
#include "weave/tile/mbarrier.cuh"
#include "weave/tile/proxy.cuh"
#include "weave/tile/softmax.cuh"
#include "weave/tile/swizzle.hpp"
#include "weave/tile/tma.cuh"
#include "weave/tile/tma.hpp"
#include "weave/tile/types.cuh"
#include "weave/tile/warpgroup.cuh"
#include "weave/tile/wgmma.cuh"
