// Learning-rate schedulers: StepLR and CosineAnnealingLR, as
// torch.optim.lr_scheduler's.
//
//   ```cpp
//   #include "nn/linear.h"
//   #include "nn/optim/lr_scheduler.h"
//   #include "nn/optim/sgd.h"
//   auto model = std::make_shared<ember::nn::Linear>(4, 2);
//   ember::nn::optim::SGD opt(model->parameters(), {.lr = 0.1});
//   ember::nn::optim::StepLR sched(opt, /*step_size=*/30, /*gamma=*/0.1);
//   for (int epoch = 0; epoch < 90; ++epoch) {
//     opt.step();                   // after an epoch of training
//     sched.step();                 // lr: 0.1, then 0.01 from epoch 30, ...
//   }
//   ```
//
// A scheduler remembers each group's learning rate when it is built (the
// base lr) and, on every step(), sets each group's lr from the closed form at
// the new epoch count:
//   StepLR:            base * gamma ^ floor(epoch / step_size)
//   CosineAnnealingLR: eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2
// Building one sets epoch 0 (the base lr). The optimizer must outlive it.
//
// Errors: non-positive step_size / T_max throw ember::Error. Thread-safety:
// thread-compatible, as the optimizer.
#ifndef EMBER_NN_OPTIM_LR_SCHEDULER_H_
#define EMBER_NN_OPTIM_LR_SCHEDULER_H_

#include <cstdint>
#include <vector>

#include "nn/optim/optimizer.h"

namespace ember::nn::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one epoch and updates every group's learning rate.
  void step();
  // The learning rates last set, one per group.
  std::vector<double> get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }

 protected:
  explicit LRScheduler(Optimizer& optimizer);
  // Sets the learning rates of epoch last_epoch(); derived constructors call
  // it once built.
  void Apply();
  virtual double LrAt(double base_lr, int64_t epoch) const = 0;

 private:
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = 0;
};

class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  double LrAt(double base_lr, int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);

 protected:
  double LrAt(double base_lr, int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

}  // namespace ember::nn::optim

#endif  // EMBER_NN_OPTIM_LR_SCHEDULER_H_
