#include "nn/optim/lr_scheduler.h"

#include <cmath>
#include <numbers>

#include "tensor/error.h"

namespace ember::nn::optim {

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    base_lrs_.push_back(optimizer.lr(g));
  }
  last_lr_ = base_lrs_;
}

void LRScheduler::Apply() {
  last_lr_.clear();
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    const double lr = LrAt(base_lrs_[g], last_epoch_);
    optimizer_.set_lr(g, lr);
    last_lr_.push_back(lr);
  }
}

void LRScheduler::step() {
  ++last_epoch_;
  Apply();
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  EMBER_CHECK(step_size > 0, "StepLR: step_size must be positive, got ", step_size);
  Apply();
}

double StepLR::LrAt(double base_lr, int64_t epoch) const {
  return base_lr * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  EMBER_CHECK(t_max > 0, "CosineAnnealingLR: T_max must be positive, got ", t_max);
  Apply();
}

double CosineAnnealingLR::LrAt(double base_lr, int64_t epoch) const {
  return eta_min_ + (base_lr - eta_min_) *
                        (1.0 + std::cos(std::numbers::pi * static_cast<double>(epoch) /
                                        static_cast<double>(t_max_))) /
                        2.0;
}

}  // namespace ember::nn::optim
