// NCCL implementation of Communicator, for data that lives in device memory: the broadcast of
// replicated entries on load (LoadOptions::device_comm) and a GPU trainer's all-gather and
// reduce-scatter. Built only where NCCL was found (SHARDCKPT_HAVE_NCCL).
//
// Data-plane calls (Broadcast, AllGatherFloat, ReduceScatterSumFloat, Barrier) take device
// pointers on `device` and run on the communicator's own stream, returning once it is done.
// Control-plane calls on host data (Gather, AllGather of descriptors, the small all-reduces) go
// to the bootstrap communicator, which must outlive this one.
#pragma once

#include <memory>

#include "shardckpt/collectives/communicator.h"

namespace shardckpt {

// Collective over `bootstrap`'s ranks: rank 0 makes the NCCL id and broadcasts it.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, int device);

}  // namespace shardckpt
