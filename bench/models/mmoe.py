"""MMoE (multi-gate mixture of experts, multi-task ads ranking: click, conversion, ...), inference, fp32.

Input features [8192, 1024] through a shared projection (1024 -> 512, ReLU); 8 experts, each an MLP (512 -> 512 ->
256, ReLU); 4 tasks, each with a gate (linear 512 -> 8, softmax over the experts) mixing the experts' outputs and a
tower (256 -> 128 -> 1); the task logits stacked [8192, 4] and a sigmoid. Batch 8192.
"""
import torch
import torch.nn as nn

BATCH = 8192
IN_DIM = 1024
SHARED_DIM = 512
NUM_EXPERTS = 8
EXPERT_HIDDEN = 512
EXPERT_OUT = 256
NUM_TASKS = 4
TOWER_HIDDEN = 128
SMALL = {"BATCH": 32, "IN_DIM": 24, "SHARED_DIM": 16, "NUM_EXPERTS": 3, "EXPERT_HIDDEN": 16, "EXPERT_OUT": 8,
         "NUM_TASKS": 2, "TOWER_HIDDEN": 8}


class Model(nn.Module):
    def __init__(self, in_dim, shared_dim, num_experts, expert_hidden, expert_out, num_tasks, tower_hidden):
        super().__init__()
        self.shared = nn.Sequential(nn.Linear(in_dim, shared_dim), nn.ReLU())
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(shared_dim, expert_hidden), nn.ReLU(), nn.Linear(expert_hidden, expert_out),
                          nn.ReLU())
            for _ in range(num_experts))
        self.gates = nn.ModuleList(nn.Linear(shared_dim, num_experts) for _ in range(num_tasks))
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(expert_out, tower_hidden), nn.ReLU(), nn.Linear(tower_hidden, 1))
            for _ in range(num_tasks))

    def forward(self, x):
        s = self.shared(x)
        experts = torch.stack([e(s) for e in self.experts], dim=1)  # [B, E, H]
        logits = []
        for gate, tower in zip(self.gates, self.towers):
            w = torch.softmax(gate(s), dim=-1)  # [B, E]
            mixed = torch.bmm(w.unsqueeze(1), experts).squeeze(1)  # [B, H]
            logits.append(tower(mixed))  # [B, 1]
        return torch.sigmoid(torch.cat(logits, dim=1))  # [B, T]


def get_inputs():
    return [torch.randn(BATCH, IN_DIM)]


def get_init_inputs():
    return [IN_DIM, SHARED_DIM, NUM_EXPERTS, EXPERT_HIDDEN, EXPERT_OUT, NUM_TASKS, TOWER_HIDDEN]
