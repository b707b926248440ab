// Model Zoo models and data processors, registered by name so YAML can name them.
#pragma once
#include <memory>
#include <string>

#include "cstorch/nn/module.h"
#include "cstorch/runtime.h"
#include "cstorch/utils/data.h"
#include "modelzoo/registry.h"

namespace modelzoo {

// A trainable model: a Module whose loss() maps one batch to a 0-d f32 loss. loss() runs
// inside the traced step (tensor ops only). In eval mode (is_training() false) a model may
// also update its metrics (cstorch/metrics.h), which the Trainer logs after validation.
class Model : public cstorch::nn::Module {
 public:
  explicit Model(std::string type_name) : Module(std::move(type_name)) {}
  virtual cstorch::Tensor loss(const cstorch::Batch& batch) = 0;
  // What loss() averages over in `batch` (host values): a validation's eval/loss weighs each
  // batch's loss by it, so that it is the mean over all of them whatever the batch size. By
  // default the batch's samples (the first dimension of its tensors); a language model's loss
  // is a mean over its unmasked tokens, so it answers their count. 0: the batch has none (its
  // loss is left out).
  virtual double loss_weight(const cstorch::Batch& batch) const;
  // Checks the values of a batch on the host before the Trainer runs its step: what a traced
  // step could otherwise report only as a failed op, without the data it came from (a class
  // label outside the model's classes, a token id outside its vocabulary, a mask value other
  // than 0 and 1). Throws cstorch::Error naming the model, the key, the position and the value;
  // the Trainer adds the step and the data section. Keys that are missing or misshapen are left
  // to loss(), which names them. By default nothing is checked.
  virtual void check_batch_values(const cstorch::Batch& batch) const;
};

using ModelPtr = std::shared_ptr<Model>;
using DataLoaderPtr = std::shared_ptr<cstorch::utils::data::DataLoader>;

// Models by name (`model: {name: fc_mnist, ...}`): the factory gets the model's arguments
// (the map without `name`).
Registry<ModelPtr>& models();
// Data processors by name (`data_processor: MNISTDataProcessor`): the factory gets the whole
// dataloader map (batch_size, data_dir, split, ...).
Registry<DataLoaderPtr>& data_processors();

}  // namespace modelzoo
