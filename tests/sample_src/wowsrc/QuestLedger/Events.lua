local ADDON, ns = ...
local QuestLedger = ns.QuestLedger

QuestLedger:RegisterEvent("PLAYER_ENTERING_WORLD", function(self, isInitialLogin, isReloadingUi)
	if not self.db then
		-- On /reload the saved variables are already loaded: bind the profile directly.
		self.db = QuestLedgerDB.profiles[QuestLedgerDB.profileKeys[ns.playerKey]]
	end
	self.groupGUID = IsInGroup() and ns.GetGroupGUID() or nil
end)

QuestLedger:RegisterEvent("GROUP_ROSTER_UPDATE", function(self)
	self.groupGUID = IsInGroup() and ns.GetGroupGUID() or nil
	if self.groupGUID and self.db.groups then
		self.db.groups[self.groupGUID] = self.db.groups[self.groupGUID] or { members = GetNumGroupMembers() }
	end
end)

-- Party progress: one entry per quest per group member.
function QuestLedger:UpdatePartyProgress(questID)
	local group = self.db.groups[self.groupGUID]
	group.progress = group.progress or {}
	group.progress[questID] = { accepted = time(), members = group.members }
end

QuestLedger:RegisterEvent("QUEST_ACCEPTED", function(self, questID)
	if self.groupGUID then
		self:UpdatePartyProgress(questID)
	end
	ns.Ledger:Add(questID)
end)
