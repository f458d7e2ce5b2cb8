// Composite kernels: elementwise (being written).
#include "tensor/ops.h"
