// The cstorch API in one include.
#pragma once
#include "cstorch/amp.h"
#include "cstorch/backend.h"
#include "cstorch/config.h"
#include "cstorch/nn/functional.h"
#include "cstorch/nn/layers.h"
#include "cstorch/nn/module.h"
#include "cstorch/optim/lr_scheduler.h"
#include "cstorch/optim/optimizer.h"
#include "cstorch/runtime.h"
#include "cstorch/state.h"
#include "cstorch/tensor.h"
#include "cstorch/utils/data.h"
