// Composite kernels: linalg (being written).
#include "tensor/ops.h"
