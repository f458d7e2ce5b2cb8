// DistributedDataParallel training fed by a DataLoader: a fixed dataset
// (1,200 samples of a learnable task: the class is the argmax of a fixed
// random linear map of the input), each rank's share chosen by a
// DistributedSampler reshuffled every epoch, batches made by two worker
// processes per rank. --stop_after=N stops the job after N steps (as a
// preemption would), with a distributed checkpoint of the model, the epoch
// and the loader's state; started again, on any number of processes, it resumes
// mid-epoch: the samples no rank trained on in that epoch are split over
// the new ranks, none lost, none trained on twice (but torch's padding).
//
//   bazel build //tools/launch //examples:ddp_data_train
//   launch=bazel-bin/tools/launch/launch program=bazel-bin/examples/ddp_data_train
//   $launch --nproc_per_node=4 $program --stop_after=5   # interrupted
//   $launch --nproc_per_node=3 $program                  # resumed on 3
//   # or resumed by an elastic launch (--nnodes=MIN:MAX --rdzv_endpoint=...)
//
// Options: --epochs=N (3), --batch=N (per rank, 16), --workers=N (2),
// --stop_after=N (0: never), --checkpoint=DIR (ddp_data_train.ckpt, a
// distributed checkpoint),
// --seen=DIR (each rank appends the index of every sample it trained on to
// DIR/seen.<world>.<rank>). Exits non-zero, with the error, when anything
// fails.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "autograd/grad_mode.h"
#include "data/dataloader.h"
#include "data/distributed_sampler.h"
#include "distributed/checkpoint/checkpoint.h"
#include "distributed/distributed.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/optim/sgd.h"
#include "parallel/distributed_data_parallel.h"
#include "serialization/state_dict.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace data = ember::data;
namespace dcp = ember::distributed::checkpoint;
namespace dist = ember::distributed;
using ember::Tensor;

namespace {

constexpr int64_t kSamples = 1200;
constexpr int64_t kFeatures = 16;
constexpr int64_t kClasses = 4;
constexpr char kLoaderPrefix[] = "loader.";

struct Options {
  int epochs = 3;
  int batch = 16;
  int workers = 2;
  int stop_after = 0;
  std::string checkpoint = "ddp_data_train.ckpt";
  std::string seen;
};

absl::Status Int(absl::string_view name, absl::string_view text, int& out, int min) {
  if (!absl::SimpleAtoi(text, &out) || out < min) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer >= ", min, ", got '", text, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Options> ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    absl::string_view rest = argv[i];
    if (absl::ConsumePrefix(&rest, "--epochs=")) {
      EMBER_RETURN_IF_ERROR(Int("epochs", rest, o.epochs, 1));
    } else if (absl::ConsumePrefix(&rest, "--batch=")) {
      EMBER_RETURN_IF_ERROR(Int("batch", rest, o.batch, 1));
    } else if (absl::ConsumePrefix(&rest, "--workers=")) {
      EMBER_RETURN_IF_ERROR(Int("workers", rest, o.workers, 0));
    } else if (absl::ConsumePrefix(&rest, "--stop_after=")) {
      EMBER_RETURN_IF_ERROR(Int("stop_after", rest, o.stop_after, 0));
    } else if (absl::ConsumePrefix(&rest, "--checkpoint=")) {
      o.checkpoint = std::string(rest);
    } else if (absl::ConsumePrefix(&rest, "--seen=")) {
      o.seen = std::string(rest);
    } else if (!absl::StartsWith(argv[i], "--local_rank=")) {  // added by launch
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown argument '", argv[i],
          "'; expected --epochs, --batch, --workers, --stop_after, --checkpoint or --seen"));
    }
  }
  return o;
}

// The dataset: [x, label, index] per sample, the same in every process.
std::shared_ptr<data::TensorDataset> MakeDataset(int64_t n, uint64_t seed) {
  ember::Generator gen(seed);
  const Tensor teacher = ember::randn({kFeatures, kClasses}, {}, &gen);
  const Tensor x = ember::randn({n, kFeatures}, {}, &gen);
  return std::make_shared<data::TensorDataset>(
      std::vector<Tensor>{x, x.matmul(teacher).argmax(1), ember::arange(n)});
}

// The checkpoint, a distributed checkpoint (a directory) that every rank
// saves together: the model's parameters, "epoch" and the loader's state
// under "loader.", each replicated (every rank has taken as many batches;
// rank 0's copy is written).
absl::Status Save(const std::string& dir, ember::nn::Module& model, int epoch,
                  const data::DataLoader& loader) {
  EMBER_ASSIGN_OR_RETURN(dist::Group group, dist::get_default_group());
  dcp::StateDict sd;
  for (auto& [name, t] : model.state_dict()) sd.emplace_back(name, dcp::replicated(t));
  sd.emplace_back("epoch", dcp::replicated(ember::full({1}, epoch, ember::kInt64)));
  for (auto& [name, t] : loader.state_dict()) {
    sd.emplace_back(kLoaderPrefix + name, dcp::replicated(t));
  }
  return dcp::save(sd, {.path = dir, .process_group = group});
}

// The epoch to start in: 0 without a checkpoint, else the saved one, with
// the model and the loader restored.
absl::StatusOr<int> Resume(const std::string& dir, ember::nn::Module& model,
                           data::DataLoader& loader) {
  if (::access(dir.c_str(), R_OK) != 0) return 0;
  EMBER_ASSIGN_OR_RETURN(auto sd, dcp::load_full_state_dict(dir));
  ember::StateDict params, loader_state;
  int epoch = 0;
  for (auto& [name, t] : sd) {
    absl::string_view rest = name;
    if (name == "epoch") {
      epoch = static_cast<int>(t.data_ptr<int64_t>()[0]);
    } else if (absl::ConsumePrefix(&rest, kLoaderPrefix)) {
      loader_state.emplace_back(std::string(rest), t);
    } else {
      params.emplace_back(name, t);
    }
  }
  EMBER_RETURN_IF_ERROR(model.load_state_dict(params));
  EMBER_RETURN_IF_ERROR(loader.load_state_dict(loader_state));
  return epoch;
}

absl::Status Train(const Options& o) {
  EMBER_RETURN_IF_ERROR(dist::init_process_group({.backend = "tcp"}));
  const int rank = dist::get_rank();
  const int world = dist::get_world_size();

  auto sampler = std::make_shared<data::DistributedSampler>(kSamples);  // the group's size, rank
  EMBER_ASSIGN_OR_RETURN(
      data::DataLoader loader,
      data::DataLoader::create(MakeDataset(kSamples, 1234), {.batch_size = o.batch,
                                                             .sampler = sampler,
                                                             .num_workers = o.workers,
                                                             .persistent_workers = o.workers > 0}));
  auto model =
      std::make_shared<ember::nn::Sequential>(std::vector<std::shared_ptr<ember::nn::Module>>{
          std::make_shared<ember::nn::Linear>(kFeatures, 64), std::make_shared<ember::nn::ReLU>(),
          std::make_shared<ember::nn::Linear>(64, kClasses)});
  EMBER_ASSIGN_OR_RETURN(const int first_epoch, Resume(o.checkpoint, *model, loader));
  EMBER_ASSIGN_OR_RETURN(auto ddp, ember::parallel::DistributedDataParallel::create(model));
  ember::nn::optim::SGD optimizer(model->parameters(), {.lr = 0.1});
  std::ofstream seen;
  if (!o.seen.empty()) {
    seen.open(absl::StrCat(o.seen, "/seen.", world, ".", rank), std::ios::app);
  }
  if (rank == 0) {
    std::printf("%d processes, starting in epoch %d (%lld samples per rank this epoch)\n", world,
                first_epoch, static_cast<long long>(sampler->size()));
  }
  int steps = 0;
  for (int epoch = first_epoch; epoch < o.epochs; ++epoch) {
    sampler->set_epoch(epoch);
    EMBER_ASSIGN_OR_RETURN(data::DataLoaderIterator it, loader.iter());
    double loss_sum = 0;
    int batches = 0;
    while (true) {
      EMBER_ASSIGN_OR_RETURN(std::optional<data::Sample> batch, it.next());
      if (!batch) break;
      EMBER_ASSIGN_OR_RETURN(Tensor x, batch->list()[0].as<Tensor>());
      EMBER_ASSIGN_OR_RETURN(Tensor y, batch->list()[1].as<Tensor>());
      EMBER_ASSIGN_OR_RETURN(Tensor index, batch->list()[2].as<Tensor>());
      optimizer.zero_grad();
      Tensor loss = ember::nn::functional::cross_entropy((*ddp)(x), y);
      loss.backward();
      optimizer.step();
      loss_sum += loss.item<double>();
      ++batches;
      if (seen.is_open()) {
        for (int64_t i = 0; i < index.numel(); ++i) seen << index.data_ptr<int64_t>()[i] << "\n";
        seen.flush();
      }
      if (o.stop_after > 0 && ++steps == o.stop_after) {
        EMBER_RETURN_IF_ERROR(Save(o.checkpoint, *model, epoch, loader));
        if (rank == 0) {
          std::printf("stopped after %d steps in epoch %d; checkpoint %s\n", steps, epoch,
                      o.checkpoint.c_str());
        }
        return dist::destroy_process_group();
      }
    }
    if (rank == 0) {
      std::printf("epoch %d  mean loss %.4f over %d steps\n", epoch,
                  batches > 0 ? loss_sum / batches : 0.0, batches);
    }
    EMBER_RETURN_IF_ERROR(Save(o.checkpoint, *model, epoch + 1, loader));
  }
  if (rank == 0) {
    ember::autograd::NoGradGuard no_grad;
    auto held_out = MakeDataset(2000, 1234);  // the same task, other inputs than the first 1,200
    const Tensor x = held_out->tensors()[0].narrow(0, kSamples, 800);
    const Tensor y = held_out->tensors()[1].narrow(0, kSamples, 800);
    const double accuracy = (*model)(x).argmax(1).eq(y).to(ember::kFloat32).mean().item<double>();
    std::printf("held-out accuracy: %.4f\n", accuracy);
  }
  return dist::destroy_process_group();
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Options> options = ParseArgs(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "ddp_data_train: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  try {
    if (absl::Status s = Train(*options); !s.ok()) {
      std::fprintf(stderr, "ddp_data_train: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "ddp_data_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
