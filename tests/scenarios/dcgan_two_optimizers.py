"""DCGAN with two optimizers and three backward passes per iteration, in the way of pytorch/examples' dcgan.

The structure of that program (dcgan/main.py), small enough for a CPU and on synthetic images:

- a map-style dataset of 4,096 synthetic 3x32x32 uint8 "photos" (smooth random colour fields
  plus noise, made once from a seeded generator), turned into float tensors in [-1, 1] in
  ``__getitem__`` as ``ToTensor()`` + ``Normalize((0.5,) * 3, (0.5,) * 3)`` would; a ``DataLoader``
  with ``batch_size=64, shuffle=True, num_workers=--workers`` (default 2, as the example);
- ``weights_init`` (conv weights N(0, 0.02), batch-norm weights N(1, 0.02), zero bias) applied to
  ``Generator`` (ConvTranspose2d + BatchNorm + ReLU stack from a ``nz`` x 1 x 1 noise vector to
  3x32x32, Tanh) and ``Discriminator`` (Conv2d + BatchNorm + LeakyReLU stack down to one Sigmoid
  score); nz = 16, ngf = ndf = 16;
- ``criterion = nn.BCELoss()``, ``optimizerD`` / ``optimizerG`` = Adam(lr 2e-4, betas (0.5, 0.999));
- per iteration: (1) ``netD.zero_grad()``, D on the real batch, ``errD_real.backward()``, D on
  ``fake.detach()``, ``errD_fake.backward()``, ``optimizerD.step()``; (2) ``netG.zero_grad()``, D on
  ``fake`` with real labels, ``errG.backward()``, ``optimizerG.step()``. Three backward passes and
  two optimizer steps make **one** training iteration (not three micro-batches of gradient
  accumulation). ``D(x)``, ``D(G(z))`` are read with ``.item()`` every iteration as in the example;
- a progress line ``[epoch/niter][i/len] Loss_D ... Loss_G ... D(x) ... D(G(z)) ...`` every
  ``--log-interval`` iterations (default 10; the example prints every iteration:
  ``--log-interval 1``); at ``i % 100 == 0`` the generator's output on ``fixed_noise`` is saved
  (a tensor file instead of ``vutils.save_image``: no torchvision needed);
- after each epoch (and when ``--steps`` stops the loop) ``torch.save(netG.state_dict())`` and
  ``torch.save(netD.state_dict())`` to a temporary directory (removed at exit).

``--steps`` = training iterations (default 60; 64 iterations per epoch). One thread
(``torch.set_num_threads(1)``): ~40-50 ms per iteration on the 2-core dev box.

``--no-loader``: no dataset and no DataLoader: the "real" batch is made in the loop with
``torch.randn(...).clamp_(-1, 1)`` (as many toy GANs do); everything else the same.

One variant (no ``--variant``; RESULT ``variant`` is ``loader`` or ``no_loader``).
Expected diagnosis: ``device_bound`` (the three forward/backward passes hold the iteration; the
data wait is the DataLoader's ``next()``, or the ``torch.randn`` with ``--no-loader``), with
**one step per iteration**; a ``sync_bound`` info is right too (the example's three ``.item()``
reads per iteration, plus two on each progress line).
Timing: ``meter.got_batch()`` first in the loop body (with ``--no-loader`` right after the batch
is made), ``meter.step_done(batch)`` after ``optimizerG.step()`` and the progress line.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import math
import shutil
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data

from common import StepMeter, make_parser, seed_everything

nc = 3  # image channels


class SyntheticImages(torch.utils.data.Dataset):
    """Smooth random colour fields + noise, stored as uint8 HWC like decoded photos."""

    def __init__(self, n, image_size, seed):
        rng = np.random.default_rng(seed)
        coarse = rng.integers(0, 256, size=(n, 4, 4, nc)).astype(np.float32)
        smooth = coarse.repeat(image_size // 4, axis=1).repeat(image_size // 4, axis=2)
        noise = rng.normal(0.0, 12.0, size=smooth.shape).astype(np.float32)
        self.images = np.clip(smooth + noise, 0, 255).astype(np.uint8)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        img = torch.from_numpy(self.images[index]).permute(2, 0, 1).float().div_(255)  # ToTensor
        img = img.sub_(0.5).div_(0.5)  # Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
        return img, 0


# custom weights initialization called on netG and netD
def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self, nz, ngf):
        super().__init__()
        self.main = nn.Sequential(
            # input is Z, going into a convolution
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            # state size. (ngf*4) x 4 x 4
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            # state size. (ngf*2) x 8 x 8
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            # state size. (ngf) x 16 x 16
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
            # state size. (nc) x 32 x 32
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self, ndf):
        super().__init__()
        self.main = nn.Sequential(
            # input is (nc) x 32 x 32
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf) x 16 x 16
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*2) x 8 x 8
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*4) x 4 x 4
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


def main():
    p = make_parser(__doc__, steps=60, variants=False)
    p.add_argument("--workers", type=int, default=2, help="number of data loading workers")
    p.add_argument("--batchSize", type=int, default=64)
    p.add_argument("--imageSize", type=int, default=32)
    p.add_argument("--nz", type=int, default=16, help="size of the latent z vector")
    p.add_argument("--ngf", type=int, default=16)
    p.add_argument("--ndf", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.0002)
    p.add_argument("--beta1", type=float, default=0.5)
    p.add_argument("--log-interval", type=int, default=10, help="iterations between progress lines")
    p.add_argument("--no-loader", action="store_true",
                   help="make the real batches in the loop with torch.randn (no dataset, no DataLoader)")
    opt = p.parse_args()
    torch.set_num_threads(1)
    seed_everything(opt.seed)
    device = torch.device("cpu")
    nz = opt.nz
    n_images = 64 * opt.batchSize  # 64 iterations per epoch

    if opt.no_loader:
        dataloader = None
        iters_per_epoch = n_images // opt.batchSize
    else:
        dataset = SyntheticImages(n_images, opt.imageSize, opt.seed)
        dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize, shuffle=True,
                                                 num_workers=opt.workers)
        iters_per_epoch = len(dataloader)
    niter = math.ceil(opt.steps / iters_per_epoch)

    netG = Generator(nz, opt.ngf).to(device)
    netG.apply(weights_init)
    netD = Discriminator(opt.ndf).to(device)
    netD.apply(weights_init)

    criterion = nn.BCELoss()
    fixed_noise = torch.randn(opt.batchSize, nz, 1, 1, device=device)
    real_label = 1.0
    fake_label = 0.0

    # setup optimizer
    optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

    outf = tempfile.mkdtemp(prefix="dcgan_")

    def fake_batches():
        for _ in range(iters_per_epoch):
            yield None

    meter = StepMeter()
    meter.start()
    step = 0
    for epoch in range(niter):
        for i, data in enumerate(dataloader if dataloader is not None else fake_batches(), 0):
            if dataloader is not None:
                meter.got_batch()
                real_cpu = data[0].to(device)
            else:
                real_cpu = torch.randn(opt.batchSize, nc, opt.imageSize, opt.imageSize, device=device).clamp_(-1, 1)
                meter.got_batch()
            ############################
            # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
            ###########################
            # train with real
            netD.zero_grad()
            batch_size = real_cpu.size(0)
            label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype, device=device)

            output = netD(real_cpu)
            errD_real = criterion(output, label)
            errD_real.backward()
            D_x = output.mean().item()

            # train with fake
            noise = torch.randn(batch_size, nz, 1, 1, device=device)
            fake = netG(noise)
            label.fill_(fake_label)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            D_G_z1 = output.mean().item()
            errD = errD_real + errD_fake
            optimizerD.step()

            ############################
            # (2) Update G network: maximize log(D(G(z)))
            ###########################
            netG.zero_grad()
            label.fill_(real_label)  # fake labels are real for generator cost
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            D_G_z2 = output.mean().item()
            optimizerG.step()

            if i % opt.log_interval == 0:
                print("[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f"
                      % (epoch, niter, i, iters_per_epoch, errD.item(), errG.item(), D_x, D_G_z1, D_G_z2),
                      flush=True)
            if i % 100 == 0:
                torch.save(real_cpu[:16].clone(), "%s/real_samples.pt" % outf)
                fake = netG(fixed_noise)
                torch.save(fake.detach()[:16].clone(), "%s/fake_samples_epoch_%03d.pt" % (outf, epoch))
            meter.step_done(batch_size)
            step += 1
            if step >= opt.steps:
                break

        # do checkpointing
        torch.save(netG.state_dict(), "%s/netG_epoch_%d.pth" % (outf, epoch))
        torch.save(netD.state_dict(), "%s/netD_epoch_%d.pth" % (outf, epoch))
        if step >= opt.steps:
            break

    saved = sorted(os.listdir(outf))
    shutil.rmtree(outf, ignore_errors=True)
    meter.print_result(
        scenario="dcgan_two_optimizers",
        variant="no_loader" if opt.no_loader else "loader",
        num_workers=0 if opt.no_loader else opt.workers,
        batch_size=opt.batchSize,
        backward_per_step=3,
        optimizer_steps_per_step=2,
        epochs=niter,
        final_loss_d=round(errD.item(), 4),
        final_loss_g=round(errG.item(), 4),
        saved=saved,
    )


if __name__ == "__main__":
    main()
