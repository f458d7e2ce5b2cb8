// The training loop of //examples:train_classifier, as a function its tests
// call: a small MLP learns three interleaved spirals in the plane (which no
// linear model separates) with cross-entropy, Adam and a cosine
// learning-rate schedule, in mini-batches, on the CPU or a CUDA device.
//
//   ```cpp
//   #include "examples/classifier_training.h"
//   ember::examples::ClassifierResult r =
//       ember::examples::train_classifier({.device = ember::kCPU, .epochs = 3, .verbose = false});
//   if (!(r.epoch_losses.back() < r.epoch_losses.front())) return absl::InternalError("no progress");
//   ```
//
// Deterministic for a given device (manual_seed; the data come from their own
// generator). Errors: ember::Error from the layers, e.g. a device whose
// kernels this build lacks.
#ifndef EMBER_EXAMPLES_CLASSIFIER_TRAINING_H_
#define EMBER_EXAMPLES_CLASSIFIER_TRAINING_H_

#include <vector>

#include "tensor/device.h"

namespace ember::examples {

struct ClassifierOptions {
  Device device = kCPU;  // model and data live here (a CUDA device with an index)
  int epochs = 60;
  int64_t batch = 32;
  bool verbose = true;  // print the model and a line every 10 epochs
};

struct ClassifierResult {
  std::vector<double> epoch_losses;  // mean training loss of each epoch
  double train_accuracy = 0;
  double test_accuracy = 0;
  Device parameters_device = kCPU;  // where the trained parameters are
};

ClassifierResult train_classifier(const ClassifierOptions& options);

}  // namespace ember::examples

#endif  // EMBER_EXAMPLES_CLASSIFIER_TRAINING_H_
