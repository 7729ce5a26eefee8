// DdlCheckStatus: passes its tensors through, or fails with the status code a host call returned.
//
// TensorFlow's PyFunc kernel turns every Python exception except ValueError/TypeError into
// UNKNOWN, so a collective that fails inside tf.numpy_function cannot raise
// FailedPreconditionError (Horovod's class for ranks that disagree) by itself. The host
// call returns (outputs..., code, message) instead, and this op, placed after it, ends the
// step with that code: Session.run and tf.function then raise the matching tf.errors class.
// Built by ddl.tensorflow.status_op (tf.sysconfig flags) when a C++ compiler is present.

#include <string>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace ddl_tf {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;

REGISTER_OP("DdlCheckStatus")
    .Input("code: int32")
    .Input("message: string")
    .Input("inputs: T")
    .Output("outputs: T")
    .Attr("T: list(type) >= 0")
    // Stateful: its failure is its effect. Grappler would otherwise drop a control edge to it.
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      for (int i = 2; i < c->num_inputs(); ++i) c->set_output(i - 2, c->input(i));
      return absl::OkStatus();
    });

class DdlCheckStatusOp : public OpKernel {
 public:
  explicit DdlCheckStatusOp(OpKernelConstruction* context) : OpKernel(context) {}

  void Compute(OpKernelContext* context) override {
    const int32_t code = context->input(0).scalar<int32_t>()();
    if (code != 0) {
      // An unknown code would be a bug in the caller: report it as such, not as success.
      const bool known = code > 0 && code <= static_cast<int32_t>(absl::StatusCode::kUnauthenticated);
      const std::string message(context->input(1).scalar<tensorflow::tstring>()());
      context->SetStatus(absl::Status(known ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kInternal,
                                      message));
      return;
    }
    for (int i = 2; i < context->num_inputs(); ++i) context->set_output(i - 2, context->input(i));
  }
};

REGISTER_KERNEL_BUILDER(Name("DdlCheckStatus").Device(tensorflow::DEVICE_CPU), DdlCheckStatusOp);

}  // namespace ddl_tf
