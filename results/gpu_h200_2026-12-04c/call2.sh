#!/usr/bin/env bash
# Call 2 of this session: call.sh's tests (without -x: call 1 stopped at its first failure), then pFedMe and
# Per-FedAvg (their steps now declared, so recorded: the commit after eaef5fc) and the methods call 1's time limit left out,
# each alone on PFLlib's protocol for 4 rounds, FedAvg again as the reference; no stacked step.
#
#     OUT=/path bash results/gpu_h200_2026-12-04c/call2.sh
m='[{name: pfedme, algorithm: pfedme, params: {lam: 1.0, personal_lr: 0.01}}],'
m+='[{name: perfedavg, algorithm: perfedavg, params: {inner_lr: 0.005}, train: {local_epochs: 2}}],'
m+='[{name: fedavg, algorithm: fedavg}],[{name: feddbe, algorithm: feddbe}],[{name: fedproto, algorithm: fedproto}],'
m+='[{name: scaffold, algorithm: scaffold}],[{name: feddyn, algorithm: feddyn}],[{name: moon, algorithm: moon}],'
m+='[{name: fedlc, algorithm: fedlc}]'
METHODS=$m STACK_S=0 TESTS_S=${TESTS_S:-230} ALONE_S=${ALONE_S:-170} bash "$(dirname "$0")/call.sh"
