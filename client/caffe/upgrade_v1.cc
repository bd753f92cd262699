// upgrade_v1.cc — see upgrade_v1.h.
#include "client/caffe/upgrade_v1.h"

namespace downpour::caffe_io {

std::string V1TypeName(::caffe::V1LayerParameter::LayerType type) {
  using V1 = ::caffe::V1LayerParameter;
  switch (type) {
    case V1::NONE:
      return "";
    case V1::ABSVAL:
      return "AbsVal";
    case V1::ACCURACY:
      return "Accuracy";
    case V1::ARGMAX:
      return "ArgMax";
    case V1::BNLL:
      return "BNLL";
    case V1::CONCAT:
      return "Concat";
    case V1::CONTRASTIVE_LOSS:
      return "ContrastiveLoss";
    case V1::CONVOLUTION:
      return "Convolution";
    case V1::DECONVOLUTION:
      return "Deconvolution";
    case V1::DATA:
      return "Data";
    case V1::DROPOUT:
      return "Dropout";
    case V1::DUMMY_DATA:
      return "DummyData";
    case V1::EUCLIDEAN_LOSS:
      return "EuclideanLoss";
    case V1::ELTWISE:
      return "Eltwise";
    case V1::EXP:
      return "Exp";
    case V1::FLATTEN:
      return "Flatten";
    case V1::HDF5_DATA:
      return "HDF5Data";
    case V1::HDF5_OUTPUT:
      return "HDF5Output";
    case V1::HINGE_LOSS:
      return "HingeLoss";
    case V1::IM2COL:
      return "Im2col";
    case V1::IMAGE_DATA:
      return "ImageData";
    case V1::INFOGAIN_LOSS:
      return "InfogainLoss";
    case V1::INNER_PRODUCT:
      return "InnerProduct";
    case V1::LRN:
      return "LRN";
    case V1::MEMORY_DATA:
      return "MemoryData";
    case V1::MULTINOMIAL_LOGISTIC_LOSS:
      return "MultinomialLogisticLoss";
    case V1::MVN:
      return "MVN";
    case V1::POOLING:
      return "Pooling";
    case V1::POWER:
      return "Power";
    case V1::RELU:
      return "ReLU";
    case V1::SIGMOID:
      return "Sigmoid";
    case V1::SIGMOID_CROSS_ENTROPY_LOSS:
      return "SigmoidCrossEntropyLoss";
    case V1::SILENCE:
      return "Silence";
    case V1::SOFTMAX:
      return "Softmax";
    case V1::SOFTMAX_LOSS:
      return "SoftmaxWithLoss";
    case V1::SPLIT:
      return "Split";
    case V1::SLICE:
      return "Slice";
    case V1::TANH:
      return "TanH";
    case V1::WINDOW_DATA:
      return "WindowData";
    case V1::THRESHOLD:
      return "Threshold";
  }
  return "";
}

void UpgradeV1Layer(::caffe::V1LayerParameter* v1, ::caffe::LayerParameter* out) {
  out->Clear();
  out->set_name(v1->name());
  out->set_type(V1TypeName(v1->type()));
  *out->mutable_bottom() = v1->bottom();
  *out->mutable_top() = v1->top();
  *out->mutable_include() = v1->include();
  *out->mutable_exclude() = v1->exclude();
  out->mutable_blobs()->Swap(v1->mutable_blobs());
  for (int i = 0; i < v1->blobs_lr_size(); ++i) {
    while (out->param_size() <= i) out->add_param();
    out->mutable_param(i)->set_lr_mult(v1->blobs_lr(i));
  }
  for (int i = 0; i < v1->weight_decay_size(); ++i) {
    while (out->param_size() <= i) out->add_param();
    out->mutable_param(i)->set_decay_mult(v1->weight_decay(i));
  }
  *out->mutable_loss_weight() = v1->loss_weight();
  if (v1->has_accuracy_param()) *out->mutable_accuracy_param() = v1->accuracy_param();
  if (v1->has_convolution_param()) *out->mutable_convolution_param() = v1->convolution_param();
  if (v1->has_data_param()) *out->mutable_data_param() = v1->data_param();
  if (v1->has_dropout_param()) *out->mutable_dropout_param() = v1->dropout_param();
  if (v1->has_image_data_param()) *out->mutable_image_data_param() = v1->image_data_param();
  if (v1->has_inner_product_param()) *out->mutable_inner_product_param() = v1->inner_product_param();
  if (v1->has_lrn_param()) *out->mutable_lrn_param() = v1->lrn_param();
  if (v1->has_pooling_param()) *out->mutable_pooling_param() = v1->pooling_param();
  if (v1->has_relu_param()) *out->mutable_relu_param() = v1->relu_param();
  if (v1->has_softmax_param()) *out->mutable_softmax_param() = v1->softmax_param();
  if (v1->has_transform_param()) *out->mutable_transform_param() = v1->transform_param();
  if (v1->has_loss_param()) *out->mutable_loss_param() = v1->loss_param();
}

}  // namespace downpour::caffe_io
