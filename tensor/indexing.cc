// Composite kernels: indexing (being written).
#include "tensor/ops.h"
