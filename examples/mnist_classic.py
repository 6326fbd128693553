"""MNIST-shaped convnet in PyTorch/XLA's classic style, on synthetic data.

Written against the upstream PyTorch/XLA 2.x API only (xm.xla_device, SampleGenerator,
xm.optimizer_step, xm.RateTracker, xm.master_print, MpDeviceLoader, test_utils, metrics): it runs
unchanged here.

  .venv/bin/python examples/mnist_classic.py --num_steps 20 --num_epochs 1
"""
import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.test.test_utils as test_utils
import torch_xla.utils.utils as xu


class MNIST(nn.Module):

  def __init__(self):
    super(MNIST, self).__init__()
    self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
    self.bn1 = nn.BatchNorm2d(10)
    self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
    self.bn2 = nn.BatchNorm2d(20)
    self.fc1 = nn.Linear(320, 50)
    self.fc2 = nn.Linear(50, 10)

  def forward(self, x):
    x = F.relu(F.max_pool2d(self.conv1(x), 2))
    x = self.bn1(x)
    x = F.relu(F.max_pool2d(self.conv2(x), 2))
    x = self.bn2(x)
    x = torch.flatten(x, 1)
    x = F.relu(self.fc1(x))
    x = self.fc2(x)
    return F.log_softmax(x, dim=1)


def parse_args(argv=None):
  p = argparse.ArgumentParser()
  p.add_argument('--batch_size', type=int, default=32)
  p.add_argument('--num_steps', type=int, default=30, help='training steps per epoch')
  p.add_argument('--num_epochs', type=int, default=1)
  p.add_argument('--lr', type=float, default=0.01)
  p.add_argument('--momentum', type=float, default=0.5)
  p.add_argument('--log_steps', type=int, default=10)
  p.add_argument('--metrics_debug', action='store_true')
  return p.parse_args(argv)


def train_mnist(flags):
  torch.manual_seed(1)
  train_loader = xu.SampleGenerator(
      data=(torch.zeros(flags.batch_size, 1, 28, 28),
            torch.zeros(flags.batch_size, dtype=torch.int64)),
      sample_count=flags.num_steps)
  test_loader = xu.SampleGenerator(
      data=(torch.zeros(flags.batch_size, 1, 28, 28),
            torch.zeros(flags.batch_size, dtype=torch.int64)),
      sample_count=max(flags.num_steps // 10, 1))

  device = xm.xla_device()
  model = MNIST().to(device)
  optimizer = optim.SGD(model.parameters(), lr=flags.lr, momentum=flags.momentum)
  loss_fn = nn.NLLLoss()

  def train_loop_fn(loader, epoch):
    tracker = xm.RateTracker()
    model.train()
    for step, (data, target) in enumerate(loader):  # MpDeviceLoader: on the device, a step per batch
      optimizer.zero_grad()
      output = model(data)
      loss = loss_fn(output, target)
      loss.backward()
      xm.optimizer_step(optimizer)
      tracker.add(flags.batch_size)
      if step % flags.log_steps == 0:
        xm.add_step_closure(
            test_utils.print_training_update,
            args=(device, step, loss, tracker.rate(), tracker.global_rate(), epoch))
    return loss

  def test_loop_fn(loader):
    total_samples = 0
    correct = 0
    model.eval()
    with torch.no_grad():
      for data, target in loader:
        output = model(data)
        pred = output.max(1, keepdim=True)[1]
        correct += pred.eq(target.view_as(pred)).sum()
        total_samples += data.size()[0]
    accuracy = 100.0 * correct.item() / total_samples
    return accuracy

  accuracy, max_accuracy = 0.0, 0.0
  last_loss = None
  for epoch in range(1, flags.num_epochs + 1):
    xm.master_print('Epoch {} train begin {}'.format(epoch, test_utils.now()))
    last_loss = train_loop_fn(pl.MpDeviceLoader(train_loader, device), epoch)
    xm.master_print('Epoch {} train end {}'.format(epoch, test_utils.now()))
    accuracy = test_loop_fn(pl.MpDeviceLoader(test_loader, device))
    xm.master_print('Epoch {} test end {}, Accuracy={:.2f}'.format(
        epoch, test_utils.now(), accuracy))
    max_accuracy = max(accuracy, max_accuracy)
    if flags.metrics_debug:
      xm.master_print(met.metrics_report())
  xm.master_print('Max Accuracy: {:.2f}%'.format(max_accuracy))
  return max_accuracy, last_loss.item()


if __name__ == '__main__':
  flags = parse_args()
  accuracy, loss = train_mnist(flags)
  xm.master_print('Final loss: {:.5f}'.format(loss))
  sys.exit(0 if accuracy >= 0 else 1)
